"""Run vLLM 0.33.0's own attention kernel tests against aotc.compat.vllm and against vLLM's kernels.

    python -m tests.gpu.conformance.vllm_runner [--peer SDIST_OR_DIR] [--impl aotc --impl vllm]
        [--file prefix_prefill --file unified --file decode] [--sample N | --sample FILE=N ...]
        [--timeout S] [--case-timeout S] [--workers W] [--jobs J] [--json OUT]

The peer comes from `--peer` (the sdist, checked against its sha256, or a folder it was extracted
to), else AOTC_VLLM_PEER, else PyPI (pinned URL and sha256, cached under ~/.cache/aotc/peers).
Nothing of vLLM's is written into this repository: the runner builds a sandbox in a temporary
folder per implementation with vLLM's three test files, vLLM's Triton kernel files and shim modules
for the few `vllm` imports they need (vllm_shims.py), binds the entry points to aotc.compat.vllm
(impl "aotc") or leaves vLLM's own (impl "vllm"), runs pytest there in a process of its own and
prints passes per test function for each. --sample N keeps every Nth case of each function (the
same cases for both; FILE=N for one file). A file over --timeout seconds reports what finished.
On an H100 test_prefix_prefill.py's cases take ~2.6 s each (its setup copies tokens one by one),
so its 231 cases a GPU (426 on two) outlast one 10-minute device call run one after another:
--workers W runs each file under pytest-xdist's W processes (the sampled cases are the same in
every worker: the conftest keeps every Nth by collection order), and --gpus N puts worker K on GPU
K mod N alone (on one H100 six workers ran 77 cases of
test_prefix_prefill.py in 265 s, no faster than one), --case-timeout fails one case
that hangs (pytest-timeout) instead of losing the file. Keep --jobs at 1 on one GPU: files run at
once share it (test_prefix_prefill.py's cases took ~10x longer beside the others, and vLLM's
column met CUDA out-of-memory).

Rows marked `internal` are tests of vLLM's kernel internals (reduce_segments, softmax_step, tile
bounds, which launches unified_attention makes: INTERNAL): in the aotc sandbox they still run
vLLM's code (the bound module re-exports it) or assert vLLM's own launches, so they say nothing
about aotc and are left out of both totals.
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
VERSION = "0.33.0"
SDIST_URL = ("https://files.pythonhosted.org/packages/f7/25/"
             f"aa5684e9c59d6fc75f78926b7f15e8d9adc7de2d9e6e7575b80776ad8169/vllm-{VERSION}.tar.gz")
SDIST_SHA256 = "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"
TEST_DIR = "tests/kernels/attention"
OPS_DIR = "vllm/v1/attention/ops"
FILES = {"prefix_prefill": "test_prefix_prefill.py", "unified": "test_triton_unified_attention.py",
         "decode": "test_triton_decode_attention.py", "per_token": "test_per_token_kv_cache.py"}
# the test files that do not sit in TEST_DIR
TEST_DIRS = {"test_per_token_kv_cache.py": "tests/quantization"}


def test_dir(name: str) -> str:
    return TEST_DIRS.get(name, TEST_DIR)


# Test functions that exercise vLLM's internals, not the bound entry point (see the docstring).
INTERNAL = {
    "test_splitk_admission_preserves_decode_and_bounds_verification",  # patches kernel_unified_attention
    "test_reduce_segments_ignores_empty_softmax_states", "test_reduce_segments_leaves_graph_padding_untouched",
    "test_splitk_softmax_recovers_after_fully_masked_tile", "test_clamped_mm_prefix_prunes_sliding_window_tiles",
    "test_clamped_mm_prefix_preserves_noncausal_right_window", "test_softcap_does_not_overflow_on_large_scores",
    # call unified_attention, then assert it launched vLLM's reduce_segments once (a spy on it)
    "test_speculative_splitk_matches_reference", "test_speculative_splitk_bf16_query_fp8_kv",
    # test_per_token_kv_cache.py: vLLM's cache writer (aotc binds no writer in the sandbox, so both
    # columns run vLLM's), its kv_cache_dtype strings and its weight loader; only
    # test_triton_unified_attention_per_token_head_scale calls the bound unified_attention
    "test_reshape_and_cache_per_token_head", "test_per_token_head_round_trip_accuracy",
    "test_int8_per_token_head_raw_cache_matches_round_reference", "test_per_token_head_negative_slot_skipped",
    "test_process_weights_sets_placeholder_scales", "TestIsQuantizedKvCache",
}


class PeerMissing(RuntimeError):
    """vLLM's files are not available (no sdist, folder or network)."""


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download(cache_dir: str) -> str:
    os.makedirs(cache_dir, exist_ok=True)
    path = os.path.join(cache_dir, f"vllm-{VERSION}.tar.gz")
    if not (os.path.exists(path) and _sha256(path) == SDIST_SHA256):
        tmp = path + ".part"
        try:
            urllib.request.urlretrieve(SDIST_URL, tmp)
        except OSError as e:
            raise PeerMissing(f"cannot download {SDIST_URL}: {e}") from e
        os.replace(tmp, path)
    return path


def _peer_root(folder: str) -> str:
    """The folder holding tests/ and vllm/ (the sdist's vllm-0.33.0/ or the folder itself)."""
    for cand in (folder, os.path.join(folder, f"vllm-{VERSION}")):
        if os.path.isdir(os.path.join(cand, TEST_DIR)) and os.path.isdir(os.path.join(cand, OPS_DIR)):
            return cand
    raise PeerMissing(f"{folder}: no {TEST_DIR} and {OPS_DIR} (an extracted vllm-{VERSION} sdist)")


def locate_peer(peer: str | None, workdir: str) -> str:
    """A folder with vLLM's test and kernel files: `peer` (sdist or folder), AOTC_VLLM_PEER, or PyPI."""
    peer = peer or os.environ.get("AOTC_VLLM_PEER")
    if peer is None:
        peer = _download(os.path.expanduser("~/.cache/aotc/peers"))
    if os.path.isdir(peer):
        return _peer_root(peer)
    if not os.path.isfile(peer):
        raise PeerMissing(f"{peer}: no such sdist or folder")
    got = _sha256(peer)
    if got != SDIST_SHA256:
        raise PeerMissing(f"{peer}: sha256 {got}, expected vLLM {VERSION}'s {SDIST_SHA256}")
    wanted = [f"vllm-{VERSION}/{test_dir(f)}/{f}" for f in FILES.values()]
    wanted += [f"vllm-{VERSION}/{OPS_DIR}/{f}" for f in _kernel_files()]
    with tarfile.open(peer) as tar:
        members = [m for m in tar.getmembers() if m.name in wanted]
        tar.extractall(workdir, members=members, filter="data")
    return _peer_root(workdir)


def _kernel_files():
    from .vllm_shims import KERNEL_FILES

    return KERNEL_FILES


def build_sandbox(root: str, impl: str, dest: str) -> str:
    """A folder with the shim `vllm` package, vLLM's kernel files (renamed _vllm_*.py and re-bound
    to aotc for impl "aotc"), the test files and the recording conftest."""
    from . import vllm_shims

    for rel, src in vllm_shims.COMMON.items():
        path = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(src)
    ops = os.path.join(dest, OPS_DIR)
    for name in vllm_shims.KERNEL_FILES:
        src = os.path.join(root, OPS_DIR, name)
        if not os.path.exists(src):
            continue
        if impl == "aotc" and name in vllm_shims.AOTC_BINDINGS:
            shutil.copyfile(src, os.path.join(ops, "_vllm_" + name))
            with open(os.path.join(ops, name), "w") as f:
                f.write(vllm_shims.aotc_binding(name, vllm_shims.AOTC_BINDINGS[name]))
        else:
            shutil.copyfile(src, os.path.join(ops, name))
    tests = os.path.join(dest, "tests")
    os.makedirs(tests, exist_ok=True)
    for name in FILES.values():
        src = os.path.join(root, test_dir(name), name)
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(tests, name))
    shutil.copyfile(os.path.join(HERE, "sandbox_conftest.py"), os.path.join(tests, "conftest.py"))
    with open(os.path.join(dest, "pytest.ini"), "w") as f:
        f.write("[pytest]\n")
    return dest


def _repo_parent() -> str:
    """The folder whose `aotc` is this checkout (the package is imported as aotc.*)."""
    import aotc.compat  # aotc itself is a namespace package (no __file__)

    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(aotc.compat.__file__))))


def run_file(sandbox: str, test_file: str, sample: int, timeout: float, log: str, workers: int = 1,
             case_timeout: float = 0.0, select: str = "", gpus: int = 0, optional: bool = False) -> dict:
    """Run one test file in the sandbox (under `workers` xdist processes when > 1, each case failed
    after `case_timeout` seconds when > 0; only the cases pytest's `-k select` keeps when given; vLLM's
    `optional` cases too when `optional`, as its --optional does); returns {"rows": [...], "timed_out": bool, "seconds": s,
    "stderr_tail": str}."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([sandbox, _repo_parent(), env.get("PYTHONPATH", "")])
    env["AOTC_CONFORMANCE_LOG"] = log
    env["AOTC_CONFORMANCE_SAMPLE"] = str(sample)
    env["AOTC_CONFORMANCE_GPUS"] = str(gpus if workers > 1 else 0)
    env["AOTC_CONFORMANCE_OPTIONAL"] = "1" if optional else "0"
    env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, "-m", "pytest", os.path.join("tests", test_file), "-q", "-p", "no:cacheprovider",
           "-c", os.path.join(sandbox, "pytest.ini"), "--rootdir", sandbox, "-o", "python_files=test_*.py",
           "--tb=line", "-W", "ignore"]
    if workers > 1:
        cmd += ["-n", str(workers)]
    if case_timeout > 0:
        cmd += ["-o", f"timeout={case_timeout:g}"]
    if select:
        cmd += ["-k", select]
    t0 = time.time()
    timed_out = False
    with open(log + ".out", "w") as out:
        proc = subprocess.Popen(cmd, cwd=sandbox, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            proc.wait()
    rows, seen = [], set()
    if os.path.exists(log):
        with open(log) as f:
            for line in f:
                row = json.loads(line)
                if row["nodeid"] not in seen:
                    seen.add(row["nodeid"])
                    rows.append(row)
    with open(log + ".out") as f:
        tail = f.read()[-3000:]
    return {"rows": rows, "timed_out": timed_out, "seconds": round(time.time() - t0, 1), "output_tail": tail,
            "returncode": proc.returncode}


def _function(nodeid: str) -> str:
    """The test function of a node id (a test class's methods count as the class)."""
    return nodeid.split("::", 1)[1].split("[", 1)[0].split("::", 1)[0]


def summarize(rows) -> dict:
    """{function: {"passed", "failed", "error", "skipped", "reasons": Counter of failure lines}}."""
    out: dict = collections.OrderedDict()
    for row in rows:
        s = out.setdefault(_function(row["nodeid"]), {"passed": 0, "failed": 0, "error": 0, "skipped": 0,
                                                      "reasons": collections.Counter()})
        s[row["outcome"]] = s.get(row["outcome"], 0) + 1
        if row["outcome"] in ("failed", "error"):
            s["reasons"][row["reason"][:160]] += 1
    return out


def table(results: dict, impls) -> str:
    """Markdown: one row per (file, test function), passed / run for each implementation."""
    lines = ["| file | test function | " + " | ".join(f"{i} passed / run (skipped)" for i in impls) + " |",
             "| --- | --- | " + " | ".join("---" for _ in impls) + " |"]
    for fname in results[impls[0]]:
        per = {i: summarize(results[i][fname]["rows"]) for i in impls}
        funcs = list(dict.fromkeys(f for i in impls for f in per[i]))
        totals = {i: [0, 0] for i in impls}
        for func in funcs:
            cells = []
            for i in impls:
                s = per[i].get(func)
                if s is None:
                    cells.append("-")
                    continue
                run = s["passed"] + s["failed"] + s["error"]
                cells.append(f"{s['passed']} / {run}" + (f" ({s['skipped']})" if s["skipped"] else ""))
                if func not in INTERNAL:
                    totals[i][0] += s["passed"]
                    totals[i][1] += run
            name = func + (" (internal)" if func in INTERNAL else "")
            lines.append(f"| {FILES[fname]} | {name} | " + " | ".join(cells) + " |")
        notes = {i: " (timed out)" if results[i][fname]["timed_out"] else "" for i in impls}
        lines.append(f"| {FILES[fname]} | **total (entry points)** | "
                     + " | ".join(f"**{totals[i][0]} / {totals[i][1]}**{notes[i]}" for i in impls) + " |")
    return "\n".join(lines)


def reasons(results: dict, impl: str, limit: int = 12) -> str:
    """The most frequent failure lines of `impl`, per file."""
    lines = []
    for fname, res in results[impl].items():
        counter = collections.Counter()
        for func, s in summarize(res["rows"]).items():
            if func not in INTERNAL:
                counter.update(s["reasons"])
        for reason, n in counter.most_common(limit):
            lines.append(f"{impl} {FILES[fname]}: {n} x {reason}")
    return "\n".join(lines)


def run(peer=None, impls=("aotc", "vllm"), files=("prefix_prefill", "unified"), sample=1, timeout=600.0, jobs=1,
        workdir=None, workers=1, case_timeout=0.0, select="", gpus=0, optional=False) -> dict:
    """{impl: {file: run_file's result}}; sample: N for every file or {file: N}. Raises PeerMissing
    without vLLM's files."""
    from concurrent.futures import ThreadPoolExecutor

    workdir = workdir or tempfile.mkdtemp(prefix="aotc-vllm-conformance-")
    root = locate_peer(peer, os.path.join(workdir, "peer"))
    sandboxes = {i: build_sandbox(root, i, os.path.join(workdir, i)) for i in impls}
    jobs_list = [(i, f) for f in files for i in impls]

    def one(job):
        i, f = job
        n = sample.get(f, 1) if isinstance(sample, dict) else sample
        return job, run_file(sandboxes[i], FILES[f], n, timeout, os.path.join(workdir, f"{i}-{f}.jsonl"), workers,
                             case_timeout, select, gpus, optional)

    results: dict = {i: {} for i in impls}
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        for (i, f), res in pool.map(one, jobs_list):
            results[i][f] = res
    for i in impls:  # keep the files' order
        results[i] = {f: results[i][f] for f in files}
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--peer", help="vLLM 0.33.0's sdist (.tar.gz) or a folder it was extracted to")
    p.add_argument("--impl", action="append", choices=("aotc", "vllm"))
    p.add_argument("--file", action="append", choices=tuple(FILES))
    p.add_argument("--sample", action="append", default=[],
                   help="N: keep every Nth case of each test function; FILE=N: of that file's only")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per test file and implementation")
    p.add_argument("--jobs", type=int, default=1, help="test files run at once")
    p.add_argument("--workers", type=int, default=1, help="pytest-xdist processes a test file (-n)")
    p.add_argument("--case-timeout", type=float, default=0.0, help="seconds before one case fails (pytest-timeout)")
    p.add_argument("--json", help="write the per-case results here")
    p.add_argument("--select", default="", help="pytest -k expression: run only the cases it keeps")
    p.add_argument("--gpus", type=int, default=0,
                   help="N > 0: each xdist worker sees one of N GPUs (worker K: GPU K mod N); 0: all see all")
    p.add_argument("--optional", action="store_true",
                   help="also run vLLM's `optional` cases (float32 models, non-power-of-2 pages), as its --optional")
    a = p.parse_args(argv)
    impls = tuple(a.impl or ("aotc", "vllm"))
    files = tuple(a.file or ("prefix_prefill", "unified"))
    sample = {f: 1 for f in files}
    for item in sorted(a.sample, key=lambda item: "=" in item):  # N first, then FILE=N
        name, _, n = item.rpartition("=")
        if name and name not in FILES:
            p.error(f"--sample {item}: FILE is one of {tuple(FILES)}")
        sample.update({name: int(n)} if name else {f: int(n) for f in files})
    try:
        import torch

        if not torch.cuda.is_available():
            print("skipped: no CUDA device")
            return 0
        results = run(a.peer, impls, files, sample, a.timeout, a.jobs, workers=a.workers, case_timeout=a.case_timeout,
                      select=a.select, gpus=a.gpus, optional=a.optional)
    except PeerMissing as e:
        print(f"skipped: {e}")
        return 0
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"version": VERSION, "sample": sample, "workers": a.workers, "results": results}, f)
    print(table(results, impls))
    for i in impls:
        print(reasons(results, i))
        for f, res in results[i].items():
            if not res["rows"]:
                print(f"{i} {FILES[f]}: no case finished; pytest output:\n{res['output_tail']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
