"""The GPU suite's two tiers (tests/gpu/conftest.py FULL): every rule names a test that exists, and
collecting the suite splits it into a quick tier and a full tier, both non-empty."""
import ast
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "tests" / "gpu"


def _full_rules() -> list[str]:
    tree = ast.parse((GPU / "conftest.py").read_text())
    full = next(n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "FULL")
    return [k.value for k in full.keys]


def test_every_full_tier_rule_names_a_gpu_test():
    for name in _full_rules():
        file, test = name.split("::")
        tree = ast.parse((GPU / file).read_text())
        assert test in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, name


def _collected(marker: str) -> set[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "pytest", "tests/gpu", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "-m", marker], capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return {line for line in out.stdout.splitlines() if "::" in line}


def test_the_suite_splits_into_a_quick_and_a_full_tier():
    quick, full, every = _collected("gpu and not full"), _collected("full"), _collected("gpu")
    assert quick and full and not quick & full and quick | full == every
    assert any("test_every_built_decode_variant" in t for t in full)
    assert any("test_formats_long_context_batch_32[" in t for t in quick)  # a sweep keeps its first cases
    assert any("test_formats_long_context_batch_32[" in t for t in full)
