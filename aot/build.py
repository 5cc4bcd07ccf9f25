"""`aotc build`: enumerate variants, compile them in worker processes, write binaries + manifest.

Incremental: each compiled variant leaves a record in `<target>/.records/<build hash>.json`
(the hash covers the key, the kernel's sources, the launch config, the Triton and aotc
versions), so an unchanged variant is never compiled twice and an interrupted build resumes.
Atomic: binaries and records are written to a temporary name then renamed; the manifest is
written last, under a file lock, merged with what another build may have written meanwhile.
"""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

from filelock import FileLock

from aotc.kernels.registry import all_specs
from aotc.kernels.variants import KernelSpec, VariantKey
from aotc.loader import targets
from aotc.loader import recipe
from aotc.loader.manifest import MANIFEST_NAME, Entry, Manifest, ManifestError, Target, read_manifest
from aotc.loader.recipe import AOTC_VERSION

from . import workers
from .progress import Progress
from .shard import SHARD_RECORD, Shard
from .shard import record as shard_record
from .sources import named_sources, normalized_source
from .triton_compat import check_backend, check_target, triton_version


@dataclass
class Job:
    target: Target
    spec_name: str
    key: str
    build_hash: str


@dataclass
class BuildReport:
    compiled: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # "target key" -> compiler message
    seconds: float = 0.0
    manifests: list[Path] = field(default_factory=list)
    interrupted: bool = False  # Ctrl-C: the manifests list what finished
    not_built: int = 0  # planned variants an interruption left unbuilt
    not_written: list[str] = field(default_factory=list)  # targets where nothing was built: no manifest

    @property
    def ok(self) -> bool:
        return not self.failed


def file_mode() -> int:
    """0666 less the process's umask (0644 under the usual 022): what open() would give a new file."""
    try:
        with open("/proc/self/status") as f:  # read, not set: os.umask() would race other threads
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, then rename over `path`. mkstemp creates the
    file 0600 whatever the umask; the final file gets the mode open() would give it, so artifacts
    built by one user (root in a container) are readable by the one who runs them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


_source_hashes: dict[str, str] = {}


def source_hash(spec: KernelSpec) -> str:
    """sha256 over the kernel's source files: its module, its declared sources and every module
    they import from their folder or aotc.kernels (aot/sources.py), each named relative to
    aotc.kernels and normalized (no comments, docstrings or layout: a prose edit rebuilds nothing)."""
    if spec.name not in _source_hashes:
        h = hashlib.sha256()
        for name, path in named_sources(spec):
            h.update(name.encode() + b"\0" + normalized_source(path) + b"\0")
        _source_hashes[spec.name] = h.hexdigest()
    return _source_hashes[spec.name]


def build_hash(spec: KernelSpec, key: VariantKey, target: Target, triton: str) -> str:
    axes = key.axis_dict
    arch = target.info.spec_arch()
    cfg = spec.launch_config(axes, arch)
    doc = {
        "key": str(key), "target": asdict(target), "triton": triton, "aotc": AOTC_VERSION,
        "sources": source_hash(spec), "signature": spec.signature(axes),
        "constexprs": {k: repr(v) for k, v in sorted(spec.compile_constexprs(axes, arch).items())},
        "divisible": spec.divisible_args(key.level), "launch": cfg.as_dict(),
        **recipe.fingerprint(target.backend),  # the recipe's number and the switches acting on this backend
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def plan_keys(kernels: Iterable[str] | None, misses: list[tuple[VariantKey, str | None]] | None,
              target: Target) -> list[tuple[KernelSpec, VariantKey]]:
    specs = all_specs()
    wanted = set(kernels) if kernels else None
    if wanted:
        unknown = wanted - set(specs)
        if unknown:
            raise ValueError(f"unknown kernel(s) {sorted(unknown)}; declared: {sorted(specs)}")
    out: dict[str, tuple[KernelSpec, VariantKey]] = {}
    arch = target.info.spec_arch()
    for name, spec in sorted(specs.items()):
        if wanted is None or name in wanted:
            for key in spec.keys(arch):  # the variants the spec declares for this target
                out[str(key)] = (spec, key)
    for key, miss_target in misses or ():
        if miss_target not in (None, target.name):
            continue
        if key.kernel not in specs:
            raise ValueError(f"miss log names unknown kernel {key.kernel!r}")
        try:
            absent = specs[key.kernel].launch_config(key.axis_dict, arch) is None
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"miss log key {key} on {target.name}: {type(e).__name__}: {e}") from None
        if absent:
            continue  # declared absent on this target: a JIT call for it raises, it never misses
        for level in specs[key.kernel].levels:
            k = key.with_level(level)
            out[str(k)] = (specs[key.kernel], k)
    return list(out.values())


def _record_path(target_dir: Path, bhash: str) -> Path:
    return target_dir / ".records" / f"{bhash}.json"


def _intact(binary: Path, size: int, sha256: str) -> bool:
    """The file holds exactly these bytes: size first (cheap), then the sha256 the record holds,
    so a damaged binary of the right size is compiled again, not reused."""
    try:
        if not binary.is_file() or binary.stat().st_size != size:
            return False
        h = hashlib.sha256()
        with open(binary, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest() == sha256
    except OSError:  # unreadable: rebuilt (and rewritten) like a missing one
        return False


def _reusable(target_dir: Path, bhash: str) -> Entry | None:
    try:
        entry = Entry(**json.loads(_record_path(target_dir, bhash).read_text()))
    except (OSError, ValueError, TypeError):  # missing, unreadable, not JSON, not an entry
        return None
    if not isinstance(entry.path, str) or not isinstance(entry.sha256, str) or not isinstance(entry.size, int):
        return None
    return entry if _intact(target_dir / entry.path, entry.size, entry.sha256) else None


def _init_worker() -> None:
    workers.install_stop_handlers()
    # No variable of the caller's environment changes the bytes (another ptxas, its options, a
    # compiler switch), and ptxas runs without address randomization (aot/workers.py says why).
    workers.pin_environment()
    workers.no_address_randomization()
    recipe.init_build_worker()  # the switches the JIT fallback compiles with too (loader/recipe.py)


def compile_job(spec_name: str, key_text: str, target_name: str, target_dir: str, bhash: str) -> dict:
    """Runs in a worker: compile one variant, write its binary and record, return the entry. A stop
    signal ends the worker once the files in progress are cleaned up (aot/workers.py)."""
    return workers.run_stoppable(_compile_job, spec_name, key_text, target_name, target_dir, bhash)


def _compile_job(spec_name: str, key_text: str, target_name: str, target_dir: str, bhash: str) -> dict:
    from aotc.kernels.registry import get_spec

    from .triton_compat import compile_variant

    spec = get_spec(spec_name)
    key = VariantKey.parse(key_text)
    info = targets.get(target_name)
    running = _running_path(Path(target_dir), bhash)  # left behind only if this process dies
    atomic_write(running, b"")
    try:
        out = compile_variant(spec, key, info)
    finally:
        running.unlink(missing_ok=True)
    digest = hashlib.sha256(out.cubin).hexdigest()
    rel = f"bin/{digest}{info.ext}"
    target_dir = Path(target_dir)
    binary = target_dir / rel
    if not _intact(binary, len(out.cubin), digest):
        atomic_write(binary, out.cubin)
    md = out.metadata
    entry = Entry(
        kernel=spec.name, key=str(key), path=rel, sha256=digest, size=len(out.cubin), symbol=out.symbol,
        params=out.params, param_names=out.param_names, divisible=list(spec.divisible_args(key.level)),
        num_warps=md["num_warps"], num_stages=md["num_stages"], num_ctas=md["num_ctas"],
        cluster_dims=md["cluster_dims"], shared=md["shared"],
        global_scratch_size=md["global_scratch_size"], global_scratch_align=md["global_scratch_align"],
        profile_scratch_size=md["profile_scratch_size"], profile_scratch_align=md["profile_scratch_align"],
        launch_cooperative_grid=md["launch_cooperative_grid"], launch_pdl=md["launch_pdl"],
        constexprs=spec.compile_constexprs(key.axis_dict, info.spec_arch()),
        provenance={"source_sha256": source_hash(spec), "build_hash": bhash, "triton_hash": out.triton_hash,
                    "triton_version": triton_version()},
    )
    atomic_write(_record_path(target_dir, bhash), json.dumps(asdict(entry), sort_keys=True).encode())
    return asdict(entry)


def _write_manifest(target: Target, target_dir: Path, entries: dict[str, Entry], triton: str,
                    replace_keys: set[str]) -> Path | None:
    """Merge with the manifest on disk (another build may have written it) and replace it. None,
    and nothing written, when no entry would be left: an empty manifest is no build."""
    with FileLock(str(target_dir / ".lock")):
        merged: dict[str, Entry] = {}
        try:
            old = read_manifest(target_dir, expect_target=target.name)
            if old.triton_version == triton:
                merged = {k: e for k, e in old.by_key().items()
                          if k not in replace_keys and (target_dir / e.path).is_file()}
        except ManifestError:
            pass
        merged.update(entries)
        if not merged:
            return None
        manifest = manifest_of(target, triton, merged)
        path = target_dir / MANIFEST_NAME
        atomic_write(path, manifest.to_json().encode())
    return path


def manifest_of(target: Target, triton: str, entries: dict[str, Entry]) -> Manifest:
    """The manifest of `entries`, ordered by key: its bytes depend on what was built, not on the
    order workers finished in (aot/merge.py writes shards' entries through it too)."""
    return Manifest(target, AOTC_VERSION, triton, [entries[k] for k in sorted(entries)])


def build(out_dir: str | os.PathLike, archs: Iterable[str], kernels: Iterable[str] | None = None,
          jobs: int | None = None, misses: list[tuple[VariantKey, str | None]] | None = None,
          progress: bool = True, echo=print, shard: Shard | None = None) -> BuildReport:
    """Compile the declared variants (or, with `shard`, its slice of them: aot/shard.py) for `archs`;
    on Ctrl-C (KeyboardInterrupt in the main thread) stop within seconds: nothing queued starts, the
    workers stop, and the manifest lists what finished (report.interrupted)."""
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ValueError(f"jobs must be a whole number of worker processes, at least 1; got {jobs!r}")
    started = time.perf_counter()
    report = BuildReport()
    triton = triton_version()
    out_dir = Path(out_dir)
    chosen = [Target.from_name(arch) for arch in dict.fromkeys(archs)]  # ValueError names a bad one
    for target in chosen:  # before anything compiles: a missing backend stops the whole build
        check_backend(target.info)
        check_target(target.info)
    plans = []
    for target in chosen:
        target_dir = out_dir / target.name
        entries: dict[str, Entry] = {}
        todo: list[Job] = []
        planned = plan_keys(kernels, misses, target)
        declared = bool(planned)  # a shard may be handed none of a small plan; the plan itself may not be empty
        if shard is not None:
            target_dir.mkdir(parents=True, exist_ok=True)
            whole, planned = [str(k) for _, k in planned], shard.select(planned)
            atomic_write(target_dir / SHARD_RECORD, shard_record(shard, whole, [str(k) for _, k in planned]))
        else:
            (target_dir / SHARD_RECORD).unlink(missing_ok=True)  # a whole build: no longer one shard
        for spec, key in planned:
            bhash = build_hash(spec, key, target, triton)
            found = _reusable(target_dir, bhash)
            if found is not None:
                entries[str(key)] = found
                report.reused.append(f"{target.name} {key}")
            else:
                todo.append(Job(target, spec.name, str(key), bhash))
        if not declared:
            which = f"kernel(s) {', '.join(sorted(kernels))} declare" if kernels else "the kernel families declare"
            raise ValueError(f"{which} no variant for target {target.name}; nothing to build")
        plans.append((target, target_dir, entries, todo))
    for _, target_dir, _, _ in plans:
        target_dir.mkdir(parents=True, exist_ok=True)

    stop = _StopRequest()
    try:
        all_jobs = [(t, d, job) for t, d, _, todo in plans for job in todo]
        if all_jobs:
            try:
                _run_jobs(all_jobs, plans, report, jobs, progress, stop, echo)
            except KeyboardInterrupt:  # between two pools: no worker runs
                report.interrupted = True
        stop.arm()  # a Ctrl-C from here on waits for the manifests (milliseconds), then counts
        for target, target_dir, entries, todo in plans:
            if report.interrupted:  # a worker may have finished a job whose result never came back
                for job in todo:
                    if job.key not in entries and f"{target.name} {job.key}" not in report.failed:
                        found = _reusable(target_dir, job.build_hash)
                        if found is not None:
                            entries[job.key] = found
                            report.compiled.append(f"{target.name} {job.key}")
                report.not_built += sum(1 for job in todo if job.key not in entries)
            planned = set(entries) | {j.key for j in todo}
            path = _write_manifest(target, target_dir, entries, triton, planned)
            if path is None:
                report.not_written.append(target.name)
            else:
                report.manifests.append(path)
        report.interrupted = report.interrupted or stop.again > 0
    finally:
        stop.disarm()
    report.seconds = time.perf_counter() - started
    return report


def _run_jobs(all_jobs, plans, report, jobs, progress, stop, echo) -> None:
    """Compile every job in worker processes. A compiler that kills its process (LLVM aborts on
    some AMD inputs) breaks the whole pool: each job marks itself running on disk, so the jobs that
    were running are compiled again one at a time (the one that dies alone is reported by key) and
    the others go back to a fresh pool."""
    entries_by_target = {t.name: entries for t, _, entries, _ in plans}
    workers_n = max(1, min(jobs or os.cpu_count() or 1, len(all_jobs)))
    bar = Progress(len(all_jobs), progress)
    pending = list(all_jobs)
    while pending and not report.interrupted:
        broken = _run_pool(pending, workers_n, entries_by_target, report, bar, stop, echo)
        suspects = [j for j in broken if _running_path(j[1], j[2].build_hash).exists()]
        pending = [j for j in broken if j not in suspects]
        for item in suspects:
            if report.interrupted:
                break
            _running_path(item[1], item[2].build_hash).unlink(missing_ok=True)
            if _run_pool([item], 1, entries_by_target, report, bar, stop, echo):
                target, target_dir, job = item
                _running_path(target_dir, job.build_hash).unlink(missing_ok=True)
                report.failed[f"{target.name} {job.key}"] = (
                    "the compiler process died compiling this variant (a crash or a signal, not a Python error)")
                bar.update(1)
    if report.interrupted:  # the markers of jobs a stopped worker left
        for _, target_dir, job in all_jobs:
            _running_path(target_dir, job.build_hash).unlink(missing_ok=True)
    bar.close()


def _running_path(target_dir: Path, bhash: str) -> Path:
    return Path(target_dir) / ".records" / f"{bhash}.running"


def _run_pool(items, workers_n, entries_by_target, report, bar, stop, echo) -> list:
    """Run `items` in one pool; the items left unfinished because a worker died. On Ctrl-C: sets
    report.interrupted, stops the pool and returns []."""
    ctx = multiprocessing.get_context("spawn")
    broken = []
    pool = ProcessPoolExecutor(max_workers=workers_n, mp_context=ctx, initializer=_init_worker)
    try:
        # Workers are spawned by submit and start with SIGINT blocked (aot/workers.py); a Ctrl-C
        # that comes meanwhile is delivered here at the unblock.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            futures = {pool.submit(compile_job, job.spec_name, job.key, target.name, str(target_dir),
                                   job.build_hash): (target, target_dir, job) for target, target_dir, job in items}
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        waiting = set(futures)
        while waiting:
            done, waiting = wait(waiting, timeout=5.0, return_when=FIRST_COMPLETED)
            bar.tick()
            for fut in done:
                target, target_dir, job = futures[fut]
                try:
                    entry = Entry(**fut.result())
                    entries_by_target[target.name][job.key] = entry
                    report.compiled.append(f"{target.name} {job.key}")
                except BrokenProcessPool:
                    broken.append(futures[fut])
                    continue
                except Exception as e:  # noqa: BLE001 - any compiler error is reported by key
                    report.failed[f"{target.name} {job.key}"] = f"{type(e).__name__}: {e}"
                bar.update(1)
    except KeyboardInterrupt:
        stop.arm()
        report.interrupted = True
        bar.interrupt()
        echo("interrupted: stopping the compile workers, then writing the manifest of what finished",
             file=sys.stderr)
        _stop_pool(pool, stop)
        return []
    except BaseException:
        _stop_pool(pool, stop)
        raise
    pool.shutdown(wait=True)
    return broken


STOP_GRACE_S = 3.0  # a worker inside a long compiler call sees SIGTERM only when the call returns


def _stop_pool(pool: ProcessPoolExecutor, stop: "_StopRequest") -> None:
    """Cancel what has not started and stop the workers: SIGTERM (the compile in flight unwinds and
    removes its temporary files), SIGKILL after STOP_GRACE_S or at a second Ctrl-C."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # no public handle on them
    pool.shutdown(wait=False, cancel_futures=True)
    for p in processes:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    while any(p.is_alive() for p in processes) and time.monotonic() < deadline and not stop.again:
        time.sleep(0.02)
    for p in processes:
        if p.is_alive():
            p.kill()
    for p in processes:
        p.join(1.0)


class _StopRequest:
    """After the first Ctrl-C, further ones only hurry the stop (workers killed at once) and never
    raise: the manifest of what finished is written either way, in milliseconds."""

    def __init__(self):
        self.again = 0
        self._previous = None

    def arm(self) -> None:
        if self._previous is None and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_again)

    def _on_again(self, signum, frame) -> None:
        self.again += 1

    def disarm(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
