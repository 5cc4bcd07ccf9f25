"""The compile recipe: what `aotc build`'s workers and the loader's JIT fallback both compile with,
so that a JIT compile of a variant key gives the build's bytes.

It holds the versions (aotc's, the one Triton the build supports, the recipe's own number), the
compiler switches, and the checked lookup of a spec's @triton.jit function. Triton is imported
inside the functions that need it only: importing this module is as light as the loader.
"""
from __future__ import annotations

import contextlib
import importlib
import os

AOTC_VERSION = "0.2.0"  # pyproject.toml's version (tests/cpu/loader/test_recipe.py checks it)
SUPPORTED_TRITON = "3.6.0"  # the one Triton whose internals aot/triton_compat.py calls; pyproject's `build` pin
# Bump when the compile path changes in a way the other build-hash inputs do not show.
COMPILE_RECIPE = 3  # 3: build workers pin their environment and run ptxas without address randomization

# (knobs group, knob, value, the backends it changes): Triton's compile switches, set alike in the
# build's workers and around every JIT-fallback compile.
SWITCHES = (
    # Line info embeds the sources' absolute path in the binary: without it the bytes depend only on
    # the sources and the Triton version, wherever the checkout sits.
    ("compilation", "disable_line_info", True, ("cuda", "hip", "corex")),
    # Triton's HIP JIT turns buffer ops on per call for tensors under 2 GB (read off each tensor's
    # storage), which a binary built ahead of time cannot know (tests/cpu/aot/test_parity.py, gfx942).
    ("amd", "use_buffer_ops", False, ("hip",)),
)


def fingerprint(backend: str) -> dict:
    """The recipe's part of a build hash on `backend`: its number and the switches that act there."""
    return {"recipe": COMPILE_RECIPE,
            "switches": {f"{group}.{knob}": value for group, knob, value, backends in SWITCHES
                         if backend in backends}}


def _set_switches(triton) -> None:
    for group, knob, value, _ in SWITCHES:
        setattr(getattr(triton.knobs, group), knob, value)


def init_build_worker() -> None:
    """A build worker's process-wide setup: compile real kernels (even when the parent runs under
    Triton's interpreter) with the recipe's switches."""
    os.environ.pop("TRITON_INTERPRET", None)
    import triton

    _set_switches(triton)


@contextlib.contextmanager
def compile_options():
    """Compile as `aotc build` does while this runs (the knobs are process-wide meanwhile), then
    restore the caller's switches."""
    import triton

    with contextlib.ExitStack() as stack:
        for group in dict.fromkeys(group for group, *_ in SWITCHES):
            stack.enter_context(getattr(triton.knobs, group).scope())
        _set_switches(triton)
        yield


def jit_function(spec, interpreted_ok: bool = True):
    """The spec's @triton.jit (or @gluon.jit) function, checked to be one and of the spec's kind;
    under TRITON_INTERPRET=1 Triton's interpreted function, unless `interpreted_ok` is False (a
    build compiles real kernels)."""
    fn = getattr(importlib.import_module(spec.module), spec.function)
    where = f"{spec.module}.{spec.function}"
    if type(fn).__name__ == "InterpretedFunction":
        if not interpreted_ok:
            raise TypeError(f"{where} is Triton's interpreted function, not a compiled one "
                            "(is TRITON_INTERPRET set in the build process?)")
        return fn
    if not hasattr(fn, "params") or not hasattr(fn, "arg_names") or not hasattr(fn, "is_gluon"):
        raise TypeError(f"{where} is not a @triton.jit function")
    if fn.is_gluon() != (spec.kind == "gluon"):
        raise TypeError(f"{spec.name}: the spec says kind={spec.kind!r} but {where} is "
                        f"{'a @gluon.jit' if fn.is_gluon() else 'a @triton.jit'} function")
    return fn
