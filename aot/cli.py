"""The `aotc` command line: thin click commands over aot.build, aot.inspect and the hub commands."""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import click

from aotc.loader.artifacts import ENV_SOURCE, default_root

from . import inspect as inspect_artifacts


@click.group()
def cli() -> None:
    """aotc: ahead-of-time compiled Triton kernels."""


@cli.command()
@click.option("--arch", "archs", multiple=True, required=True,
              help="Target (repeatable): smNN (NVIDIA, e.g. sm90, sm80), gfx942 or gfx90a (AMD), "
                   "ivcore11 or ivcore20 (Iluvatar, with FlagTree's Triton).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Artifacts folder (default: the loader's default, artifacts/ in a checkout).")
@click.option("--kernel", "kernels", multiple=True, help="Build only these kernels (repeatable).")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Worker processes, at least 1 (default: CPU count).")
@click.option("--from-misses", "misses_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Also build the keys listed in a miss log (JSON lines).")
@click.option("--quiet", is_flag=True, help="No progress output.")
@click.option("--shard", "shard_text", default=None, metavar="I/N",
              help="Build only shard I of N (0 <= I < N): every Nth variant of the plan; `aotc merge` joins the shards.")
def build(archs, out_dir, kernels, jobs, misses_file, quiet, shard_text) -> None:
    """Compile every declared variant for each target into OUT/<target>/.

    Ctrl-C stops within seconds: the manifest lists what finished, exit status 130, and the same
    command resumes. Off a terminal, progress is a line every 5% or 30 s."""
    from .build import build as run_build
    from .shard import Shard
    from .triton_compat import UnsupportedTritonError

    out = out_dir or str(default_root())
    try:
        misses = _read_misses(misses_file) if misses_file else None
        shard = Shard.parse(shard_text) if shard_text is not None else None
        report = run_build(out, archs, kernels=kernels or None, jobs=jobs, misses=misses, progress=not quiet,
                           shard=shard)
    except KeyboardInterrupt:  # while planning, before any worker started
        _interrupted("nothing was compiled")
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    except UnsupportedTritonError as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:  # a full disk, a folder it may not write: the previous manifest is still whole
        raise click.ClickException(f"writing artifacts to {out} failed: {e}; the previous manifest, if any, "
                                   "is unchanged and the next build resumes") from None
    for target in report.not_written:
        click.echo(f"{target}: no variant was built, so no manifest was written", err=True)
    if report.interrupted:
        _interrupted(f"{len(report.compiled)} compiled and {len(report.reused)} up to date are in the manifest, "
                     f"{report.not_built} not built")
    click.echo(f"{len(report.compiled)} compiled, {len(report.reused)} up to date, "
               f"{len(report.failed)} failed in {report.seconds:.1f}s -> {out}")
    for key, message in sorted(report.failed.items()):
        click.echo(f"FAILED {key}\n{message}", err=True)
    if not report.ok or report.not_written:
        sys.exit(1)


def _read_misses(path):
    from aotc.kernels.registry import all_specs

    from .misses import read_miss_log

    try:
        return read_miss_log(path, all_specs())
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--from-misses") from None
    except OSError as e:
        raise click.BadParameter(f"cannot read {path}: {e.strerror}", param_hint="--from-misses") from None


def _interrupted(what: str) -> None:
    """Ctrl-C's last words: one line, exit 130 (128 + SIGINT), and no traceback from a second one."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    click.echo(f"interrupted: {what}; run the same command to resume", err=True)
    sys.exit(130)


def _artifacts_folder(directory: str | None) -> Path:
    """DIRECTORY, else AOTC_ARTIFACTS (as the loader reads it), else the default folder."""
    if directory:
        return Path(directory)
    source = os.environ.get(ENV_SOURCE)
    if not source:
        return default_root()
    if source.startswith("hf://"):
        raise click.UsageError(f"{ENV_SOURCE}={source} names a Hub revision; this command reads a folder: "
                               "pass one, or `aotc pull` (which verifies every file) with --out")
    if not Path(source).expanduser().is_dir():
        raise click.UsageError(f"{ENV_SOURCE}={source} is not a folder")
    return Path(source).expanduser()


@cli.command("list")
@click.argument("directory", type=click.Path(exists=True, file_okay=False), required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_command(directory, as_json) -> None:
    """Kernels, variant counts and bytes per target in DIRECTORY (default: AOTC_ARTIFACTS, else the
    default folder); exit 1 if a manifest is refused."""
    directory = _artifacts_folder(directory)
    try:
        summary = inspect_artifacts.summarize(directory)
    except OSError as e:  # a folder it may not list
        raise click.ClickException(f"cannot read {e.filename or directory}: {e.strerror}") from None
    refused = any("error" in info for info in summary.values())  # named in the output, then exit 1
    if as_json:
        click.echo(json.dumps(summary, indent=1, sort_keys=True))
        sys.exit(1 if refused else 0)
    if not summary:
        click.echo(f"no targets in {directory}")
    for target, info in sorted(summary.items()):
        if "error" in info:
            click.echo(f"{target}: {info['error']}")
            continue
        click.echo(f"{target}: {info['binaries']} binaries, {info['bytes']} bytes "
                   f"({info['backend']} {info['arch']}, warp {info['warp_size']}; "
                   f"Triton {info['triton_version']}, aotc {info['aotc_version']})")
        for kernel, k in sorted(info["kernels"].items()):
            click.echo(f"  {kernel:24s} {k['variants']:5d} variants {k['binaries']:5d} binaries {k['bytes']:10d} bytes")
    if refused:
        sys.exit(1)


@cli.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False), required=False)
def verify(directory) -> None:
    """Check every binary's sha256, ELF arch and symbol in DIRECTORY (default: AOTC_ARTIFACTS, else
    the default folder); exit non-zero naming every bad entry."""
    directory = _artifacts_folder(directory)
    try:
        problems, checked = inspect_artifacts.verify(directory)
    except OSError as e:  # a folder it may not list
        raise click.ClickException(f"cannot read {e.filename or directory}: {e.strerror}") from None
    for p in problems:
        click.echo(f"BAD {p}", err=True)
    click.echo(f"{checked} entries checked, {len(problems)} problems")
    if problems:
        sys.exit(1)


@cli.command("check-reproducible")
@click.option("--arch", "archs", multiple=True, required=True, help="Target (repeatable), as for build.")
@click.option("--kernel", "kernels", multiple=True, help="Only these kernels (repeatable; default: all).")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None, help="Worker processes a build.")
def check_reproducible(archs, kernels, jobs) -> None:
    """Build twice in fresh Triton caches (other hash seeds) and compare every binary's sha256;
    exit 1 naming each key whose bytes differ. A release step: run it for every target shipped."""
    from .reproducible import double_build

    result = double_build(archs, kernels, jobs)
    for message in result.failed:
        click.echo(message, err=True)
    for line in result.differ:
        click.echo(f"DIFFERS {line}", err=True)
    for line in result.only_one:
        click.echo(f"ONLY IN ONE BUILD {line}", err=True)
    click.echo(f"{result.compared} binaries compared, {len(result.differ)} differ")
    if not result.ok:
        sys.exit(1)


@cli.command()
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.argument("shard_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
def merge(out_dir, shard_dirs) -> None:
    """Join the --out folders of `aotc build --shard I/N` runs into OUT_DIR: one manifest a target,
    the bytes a single machine's build writes; refused where a shard is missing or incomplete."""
    from .merge import MergeError, merge as run_merge

    try:
        report = run_merge(out_dir, list(shard_dirs))
    except MergeError as e:
        raise click.ClickException(str(e)) from None
    for target, count in sorted(report.targets.items()):
        click.echo(f"{target}: {count} entries from {len(shard_dirs)} folder(s) -> {out_dir}")


def _register_hub_commands() -> None:
    try:
        from .hub_commands import pull_command, push_command
    except ImportError:
        return
    cli.add_command(push_command, "push")
    cli.add_command(pull_command, "pull")


_register_hub_commands()


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
