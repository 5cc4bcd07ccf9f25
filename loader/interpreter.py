"""Fixes to Triton 3.6's interpreter, applied when the ops run on CPU tensors under
TRITON_INTERPRET=1 (the JIT fallback's interpreter branch calls `patch_interpreter`).

1. A scalar becomes a Python int through `int(array)`, which NumPy >= 2.4 refuses for the
   interpreter's 1-element arrays (triton-lang/triton#9171), so `range(lo, hi)` over runtime
   bounds fails. Upstream's fix: squeeze first.
2. bf16 values are held as their uint16 bits, but `tl.dot` multiplies those bits as integers,
   casts between bf16 and anything but fp32 reinterpret them, and fp32 -> bf16 truncates where
   the GPU rounds to nearest even (a bias of half an ulp). Here bf16 dot operands widen to fp32
   (bf16 products are exact in fp32, as on tensor cores) and every bf16 cast goes through fp32,
   rounded by torch (to nearest even).
"""
from __future__ import annotations


def _bf16_to_fp32(bits):
    import numpy as np

    return (bits.astype(np.uint32) << 16).view(np.float32)


def _fp32_to_bf16(values):
    import numpy as np
    import torch

    t = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).to(torch.bfloat16)
    return t.view(torch.int16).numpy().view(np.uint16)


def patch_interpreter() -> None:
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_aotc_compat", False):
        return
    builder._aotc_compat = True

    original_patch_tensor = interpreter._patch_lang_tensor

    def patch_tensor(tensor, scope):
        original_patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    interpreter._patch_lang_tensor = patch_tensor

    original_dot = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16 or b.dtype.scalar == tl.bfloat16:
            a = interpreter.TensorHandle(_bf16_to_fp32(a.data), tl.float32) if a.dtype.scalar == tl.bfloat16 else a
            b = interpreter.TensorHandle(_bf16_to_fp32(b.data), tl.float32) if b.dtype.scalar == tl.bfloat16 else b
        return original_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    builder.create_dot = create_dot

    original_cast = builder.cast_impl

    def cast_impl(self, src, dst_type):
        s, d = src.dtype.scalar, dst_type.scalar
        if s == d or tl.bfloat16 not in (s, d):
            return original_cast(self, src, dst_type)
        if s == tl.bfloat16:
            return original_cast(self, interpreter.TensorHandle(_bf16_to_fp32(src.data), tl.float32), dst_type)
        wide = original_cast(self, src, tl.float32) if s != tl.float32 else src
        return interpreter.TensorHandle(_fp32_to_bf16(wide.data), tl.bfloat16)

    builder.cast_impl = cast_impl
