"""The `aotc` command line: thin click commands over aot.build, aot.inspect and the hub commands."""
from __future__ import annotations

import json
import sys

import click

from aotc.loader.artifacts import default_root

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
@click.option("--jobs", "-j", type=int, default=None, help="Worker processes (default: CPU count).")
@click.option("--from-misses", "misses_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Also build the keys listed in a miss log (JSON lines).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--shard", "shard_text", default=None, metavar="I/N",
              help="Build only shard I of N (0 <= I < N): every Nth variant of the plan; `aotc merge` joins the shards.")
def build(archs, out_dir, kernels, jobs, misses_file, quiet, shard_text) -> None:
    """Compile every declared variant for each target into OUT/<target>/."""
    from aotc.loader.fallback import read_misses

    from .build import build as run_build
    from .shard import Shard
    from .triton_compat import UnsupportedTritonError

    misses = read_misses(misses_file) if misses_file else None
    out = out_dir or str(default_root())
    try:
        shard = Shard.parse(shard_text) if shard_text is not None else None
        report = run_build(out, archs, kernels=kernels or None, jobs=jobs, misses=misses, progress=not quiet,
                           shard=shard)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    except UnsupportedTritonError as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:  # a full disk, a folder it may not write: the previous manifest is still whole
        raise click.ClickException(f"writing artifacts to {out} failed: {e}; the previous manifest, if any, "
                                   "is unchanged and the next build resumes") from None
    click.echo(f"{len(report.compiled)} compiled, {len(report.reused)} up to date, "
               f"{len(report.failed)} failed in {report.seconds:.1f}s -> {out}")
    for key, message in sorted(report.failed.items()):
        click.echo(f"FAILED {key}\n{message}", err=True)
    if not report.ok:
        sys.exit(1)


@cli.command("list")
@click.argument("directory", type=click.Path(exists=True, file_okay=False), required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_command(directory, as_json) -> None:
    """Kernels, variant counts and bytes per target in DIRECTORY; exit 1 if a manifest is refused."""
    summary = inspect_artifacts.summarize(directory or default_root())
    refused = any("error" in info for info in summary.values())  # named in the output, then exit 1
    if as_json:
        click.echo(json.dumps(summary, indent=1, sort_keys=True))
        sys.exit(1 if refused else 0)
    if not summary:
        click.echo(f"no targets in {directory or default_root()}")
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
    """Check every binary's sha256, ELF arch and symbol; exit non-zero naming every bad entry."""
    problems, checked = inspect_artifacts.verify(directory or default_root())
    for p in problems:
        click.echo(f"BAD {p}", err=True)
    click.echo(f"{checked} entries checked, {len(problems)} problems")
    if problems:
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
