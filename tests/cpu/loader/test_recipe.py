"""loader/recipe.py: one recipe for the build's workers and the JIT fallback (versions, compiler
switches, the checked jit function), importable without Triton."""
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from aotc.loader import recipe

REPO = Path(__file__).resolve().parents[3]


def test_versions_are_pyprojects():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["version"] == recipe.AOTC_VERSION
    assert f"triton=={recipe.SUPPORTED_TRITON}" in project["optional-dependencies"]["build"]


def test_importing_the_recipe_imports_no_triton():
    code = "import sys, aotc.loader.recipe; print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_compile_options_set_every_switch_and_restore_the_callers():
    import triton

    knobs = [(getattr(triton.knobs, group), knob, value) for group, knob, value, _ in recipe.SWITCHES]
    saved = [getattr(g, k) for g, k, _ in knobs]
    try:
        for group, knob, value in knobs:
            setattr(group, knob, not value)
        with recipe.compile_options():
            assert [getattr(g, k) for g, k, _ in knobs] == [v for _, _, v in knobs]
        assert [getattr(g, k) for g, k, _ in knobs] == [not v for _, _, v in knobs]
    finally:
        for (group, knob, _), old in zip(knobs, saved):
            setattr(group, knob, old)


def test_a_build_worker_compiles_real_kernels_with_the_switches():
    code = ("import os; os.environ['TRITON_INTERPRET'] = '1'; from aotc.loader import recipe; "
            "recipe.init_build_worker(); import triton; "
            "print(os.environ.get('TRITON_INTERPRET'), triton.knobs.compilation.disable_line_info, "
            "triton.knobs.amd.use_buffer_ops)")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_DISABLE_LINE_INFO", "AMDGCN_USE_BUFFER_OPS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split() == ["None", "True", "False"], out.stderr


def test_the_build_hash_carries_the_switches_acting_on_its_backend():
    cuda, hip = recipe.fingerprint("cuda"), recipe.fingerprint("hip")
    assert cuda["recipe"] == hip["recipe"] == recipe.COMPILE_RECIPE
    assert cuda["switches"] == {"compilation.disable_line_info": True}
    assert hip["switches"] == {"compilation.disable_line_info": True, "amd.use_buffer_ops": False}


def test_jit_function_refuses_what_is_not_a_kernel_of_the_specs_kind():
    from aotc.kernels.registry import get_spec

    spec = get_spec("tiny_axpy")
    fn = recipe.jit_function(spec)  # under the CPU suite's TRITON_INTERPRET=1: the interpreted function
    assert type(fn).__name__ == "InterpretedFunction"
    with pytest.raises(TypeError, match="TRITON_INTERPRET set in the build process"):
        recipe.jit_function(spec, interpreted_ok=False)
    not_a_kernel = SimpleNamespace(name="x", module="aotc.loader.recipe", function="fingerprint", kind="triton")
    with pytest.raises(TypeError, match="aotc.loader.recipe.fingerprint is not a @triton.jit function"):
        recipe.jit_function(not_a_kernel)
