"""A kernel's decorator as the build reads it, whatever TRITON_INTERPRET says (tests/cpu sets it)."""


def as_jit(fn):
    """The JITFunction the decorator makes without TRITON_INTERPRET (same arguments): its params
    carry the specialization switches the build checks (aot.triton_compat.check_consistency)."""
    if hasattr(fn, "params"):
        return fn
    from triton.runtime.jit import JITFunction

    return JITFunction(fn.fn, **fn.kwargs)
