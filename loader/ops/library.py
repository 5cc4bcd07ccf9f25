"""The `aotc` torch.library namespace: every public op is also a dispatcher op
(`torch.ops.aotc.<name>`), so `torch.compile(fullgraph=True)` traces through it.

Ops are defined with explicit schemas on one `torch.library.Library`, the real implementation
under CompositeExplicitAutograd (CPU and CUDA) and the shape-only one under Meta (what fake
tensors run while tracing). `torch.library.custom_op` would infer the same schemas, but its
registration inspects source files and costs several milliseconds an op, paid by the first call
of the op in a fresh process (which imports it); this costs a few hundred microseconds.
"""
from __future__ import annotations

import torch

_LIB = torch.library.Library("aotc", "FRAGMENT")


def define(schema: str, impl, fake) -> None:
    """Define `aotc::<name>(...)` from `schema`: `impl` runs it, `fake` checks it on meta tensors."""
    name = schema.split("(", 1)[0]
    _LIB.define(schema)
    _LIB.impl(name, impl, "CompositeExplicitAutograd")
    _LIB.impl(name, fake, "Meta")
