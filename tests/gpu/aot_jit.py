"""The two ways a GPU test runs an op: `aot(fn)` on the built binaries (a JIT fallback is an error,
so an unbuilt key fails loudly) and the `jit_only` fixture's `jit(fn)`, through Triton's JIT from
an empty artifacts folder; a test imports both and compares their outputs bit for bit."""
import hashlib
import warnings

import pytest
import torch

from aotc import loader
from aotc.loader import dispatch
from aotc.kernels.variants import ALIGNED, GENERIC
from aotc.loader.fallback import AotcJitFallbackWarning, jit_kernel


def aot(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("error", AotcJitFallbackWarning)  # the AOT run must not fall back
        got = fn()
    torch.cuda.synchronize()
    return got


def loaded_entries(kernel: str, axes: dict) -> list:
    """The manifest entries (ALIGNED, GENERIC) of `kernel` at `axes` that this process's AOT launches
    loaded since the last artifacts switch: the binaries a JIT compile of the same call must equal."""
    return [b.entry for (name, key, _), sel in list(dispatch._selections.items())
            if name == kernel and dict(key) == axes for b in sel.loaded.values()]


def jit_cubin_shas(spec) -> set:
    """sha256 of every cubin this process's JIT compiled for `spec`, at both levels: the kernel's own
    function (ALIGNED calls) and the unspecialized copy that GENERIC calls compile with."""
    fns = {id(f): f for f in (jit_kernel(spec, ALIGNED), jit_kernel(spec, GENERIC))}
    return {hashlib.sha256(k.asm["cubin"]).hexdigest()
            for fn in fns.values() for cache in fn.device_caches.values() for k in cache[0].values()}


@pytest.fixture
def jit_only(tmp_path, monkeypatch):
    """Switch the loader to an empty artifacts folder: every call runs through Triton's JIT."""
    monkeypatch.setenv("AOTC_MISS_LOG", str(tmp_path / "misses.jsonl"))

    def jit(fn):
        loader.set_artifacts(tmp_path)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", AotcJitFallbackWarning)
                got = fn()
            torch.cuda.synchronize()
        finally:
            loader.set_artifacts(None)
        return got
    yield jit
    loader.set_artifacts(None)
