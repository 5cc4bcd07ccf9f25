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
def build(archs, out_dir, kernels, jobs, misses_file, quiet) -> None:
    """Compile every declared variant for each target into OUT/<target>/."""
    from aotc.loader.fallback import read_misses

    from .build import build as run_build
    from .triton_compat import UnsupportedTritonError

    misses = read_misses(misses_file) if misses_file else None
    out = out_dir or str(default_root())
    try:
        report = run_build(out, archs, kernels=kernels or None, jobs=jobs, misses=misses, progress=not quiet)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    except UnsupportedTritonError as e:
        raise click.ClickException(str(e)) from None
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
    """Kernels, variant counts and bytes per target in DIRECTORY."""
    summary = inspect_artifacts.summarize(directory or default_root())
    if as_json:
        click.echo(json.dumps(summary, indent=1, sort_keys=True))
        return
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
