"""Two fixes to Triton 3.6's interpreter that these CPU tests need (it is not used on GPUs).

1. NumPy >= 2.3: the interpreter keeps every scalar as a 1-element array and `range()` calls
   `int()` on it, which NumPy now refuses ("only 0-dimensional arrays can be converted to
   Python scalars"), so any loop whose bounds come from a load fails. The kernel's loops start
   and end at lengths read from memory.
2. `tl.dot` on bfloat16: the interpreter stores bf16 as uint16 bit patterns and multiplies the
   integers. Here bf16 operands are widened to float32 first (exact), as the tensor cores do.
`install()` is idempotent.
"""
import numpy as np


def install() -> None:
    import triton.language as tl
    from triton.runtime import interpreter

    if getattr(interpreter._patch_lang_tensor, "_aotc_shim", False):
        return
    patch_tensor = interpreter._patch_lang_tensor

    def patched_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched_tensor._aotc_shim = True
    interpreter._patch_lang_tensor = patched_tensor

    builder = interpreter.InterpreterBuilder
    create_dot = builder.create_dot

    def widen(h):
        if h.dtype.scalar != tl.bfloat16:
            return h
        bits = h.data.astype(np.uint32) << 16
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def patched_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return create_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    builder.create_dot = patched_dot
