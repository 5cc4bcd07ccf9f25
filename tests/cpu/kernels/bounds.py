"""An address check for kernels run by Triton's interpreter: every element a load or store touches
under its mask must lie inside one of the launch's tensor arguments. A GPU faults (or reads another
buffer) where this fails; where it holds, an illegal address on the GPU is the compiled binary's,
not the kernel's arithmetic."""
from __future__ import annotations

import contextlib


class Violation(AssertionError):
    pass


@contextlib.contextmanager
def addresses_checked():
    """Within the block, an interpreted load or store outside its launch's tensors raises Violation
    (naming the kernel, the access kind, how many elements and the first address)."""
    import numpy as np
    from triton.runtime import interpreter as interp

    spans = []  # (first byte, end byte) of each tensor argument's storage, for the running launch
    kernel = [""]
    builder, executor = interp.InterpreterBuilder, interp.GridExecutor
    saved = builder.create_masked_load, builder.create_masked_store, executor._init_args_hst

    def init_args(self, args_dev, kwargs):
        args, kw = saved[2](self, args_dev, kwargs)
        spans[:] = [(t.untyped_storage().data_ptr(), t.untyped_storage().data_ptr() + t.untyped_storage().nbytes())
                    for t in (*args, *kw.values()) if hasattr(t, "untyped_storage")]
        kernel[0] = getattr(self.fn, "__name__", "?")
        return args, kw

    def check(kind, ptrs, mask):
        p = ptrs.data[mask.data.astype(bool)]
        if p.size == 0:
            return
        size = np.dtype(interp._get_np_dtype(ptrs.get_element_ty())).itemsize
        inside = np.zeros(p.shape, bool)
        for lo, hi in spans:
            inside |= (p >= lo) & (p + size <= hi)
        if not inside.all():
            raise Violation(f"{kernel[0]}: {kind} of {int((~inside).sum())} element(s) outside every tensor "
                            f"argument, first at {hex(int(p[~inside][0]))}")

    def load(self, ptrs, mask, other, *rest):
        check("load", ptrs, mask)
        return saved[0](self, ptrs, mask, other, *rest)

    def store(self, ptrs, value, mask, *rest):
        check("store", ptrs, mask)
        return saved[1](self, ptrs, value, mask, *rest)

    builder.create_masked_load, builder.create_masked_store, executor._init_args_hst = load, store, init_args
    try:
        yield
    finally:
        builder.create_masked_load, builder.create_masked_store, executor._init_args_hst = saved
