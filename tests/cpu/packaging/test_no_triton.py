"""aotc without Triton: the installed metadata requires none at run time, and in a Python where
Triton cannot be imported the loader loads manifests, chooses and launches binaries (through a
fake driver), validates inputs, and turns every need for Triton into a clear error
(no_triton_check.py, run in a subprocess: one torch import, a few seconds)."""
import importlib.metadata
import os
import re
import site
import subprocess
import sys
from pathlib import Path

from aotc.aot.triton_compat import SUPPORTED_TRITON

from ..aot.conftest import REPO, tiny_artifacts  # noqa: F401  (the session fixture)


def _requirement_names(extra: str | None) -> list[str]:
    out = []
    for req in importlib.metadata.requires("aotc") or []:
        spec, _, marker = req.partition(";")
        wanted = re.search(r'extra\s*==\s*"([^"]+)"', marker)
        if (wanted.group(1) if wanted else None) == extra:
            out.append(spec.strip())
    return out


def test_runtime_requirements_name_no_triton_and_the_build_extra_pins_the_supported_one():
    runtime = _requirement_names(None)
    assert runtime and not [r for r in runtime if r.lower().startswith("triton")], runtime
    assert {re.split(r"[<>=!~\[ ]", r)[0].lower() for r in runtime} == {"torch", "click", "huggingface_hub", "filelock"}
    assert f"triton=={SUPPORTED_TRITON}" in _requirement_names("build")
    assert "aotc[build]" in _requirement_names("test")  # the CPU tests run the interpreter


def _site_without_triton(folder: Path) -> Path:
    """One folder of links to everything in this Python's site folders except Triton."""
    folders = [*site.getsitepackages(), site.getusersitepackages(),
               *(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))]
    folder.mkdir()
    for source in map(Path, dict.fromkeys(folders)):
        if not source.is_dir():
            continue
        for item in source.iterdir():
            if not item.name.lower().startswith("triton") and not (folder / item.name).exists():
                (folder / item.name).symlink_to(item)
    return folder


def test_the_loader_runs_without_triton(tiny_artifacts, tmp_path):  # noqa: F811
    site_dir = _site_without_triton(tmp_path / "site")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH", "AOTC_ARTIFACTS")}
    env["AOTC_EXTRA_SPECS"] = "tests.cpu.fixtures.tiny.spec"
    script = Path(__file__).with_name("no_triton_check.py")
    run = subprocess.run([sys.executable, "-S", str(script), str(site_dir), str(tiny_artifacts), str(tmp_path)],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("ok: ") == 7, run.stdout
