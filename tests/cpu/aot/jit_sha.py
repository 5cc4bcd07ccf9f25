"""Run as a script (without TRITON_INTERPRET): compile a call the way Triton's JIT does — its own
binder decides the specialization from the argument values — and print the cubin's sha256.
Only the driver-dependent steps of `JITFunction.run` are left out (there is no GPU here)."""
import hashlib
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.runtime.jit import create_function_from_signature

from aotc.aot.triton_compat import ast_source
from aotc.kernels.registry import get_spec
from aotc.loader import targets
from aotc.loader.fallback import jit_kernel
from aotc.loader.recipe import compile_options, jit_function


def jit_sha(spec_name, axes, args, name, level=None):
    """level: compile with the function the loader's JIT fallback takes for a call at that level
    (fallback.jit_kernel); None: the kernel's own, as a plain Triton JIT call."""
    with compile_options():  # the switches the loader's JIT fallback compiles with (the binder reads them too)
        return _jit_sha(spec_name, axes, args, name, level)


def _jit_sha(spec_name, axes, args, name, level=None):
    spec = get_spec(spec_name)
    fn = jit_function(spec) if level is None else jit_kernel(spec, level)
    info = targets.get(name if isinstance(name, str) else f"sm{name}")  # main's callers pass an SM int
    target = GPUTarget(info.backend, info.arch, info.warp_size)
    backend = make_backend(target)
    arch = info.spec_arch()
    cfg = spec.launch_config(axes, arch)
    kwargs = dict(spec.compile_constexprs(axes, arch), **cfg.triton_options())
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    kwargs["debug"] = False
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    kernel = triton.compile(ast_source(spec, fn, signature, constexprs, attrs), target=target, options=options.__dict__)
    return hashlib.sha256(kernel.asm[info.asm]).hexdigest()


if __name__ == "__main__":
    arch = sys.argv[1]  # a target name: sm90, gfx942
    base = torch.empty(4096, dtype=torch.float16)
    assert base.data_ptr() % 16 == 0
    aligned = [base[:1024], base[1024:2048], base[2048:3072], 64, 40, 3, 0.5]
    # Every specializable argument misaligned: pointers 2 bytes off, stride 33.
    generic = [base[1:], base[1025:], base[2049:], 33, 40, 3, 0.5]
    axes = {"block": 64, "dtype": "fp16"}
    print(jit_sha("tiny_axpy", axes, aligned, arch), jit_sha("tiny_axpy", axes, generic, arch))
