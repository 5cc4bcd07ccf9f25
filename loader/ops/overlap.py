"""Whether two tensors share memory: the ops refuse an output that overlaps an input where the
overlap would change the answer (store_kv's two caches, prefix_prefill's out over k/v)."""
from __future__ import annotations

import torch


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first byte, last byte + 1) that t's elements can touch."""
    start = t.data_ptr()
    extent = sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride())) + 1
    return start, start + extent * t.element_size()


def overlap(a, b) -> bool:
    """True when tensors a and b may touch the same bytes (byte ranges of one storage intersect).
    False for None, empty tensors, meta or fake tensors (no memory to compare)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or not a.numel() or not b.numel():
        return False
    if a.device != b.device or a.device.type == "meta":
        return False
    try:
        if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
            return False
        (a0, a1), (b0, b1) = _span(a), _span(b)
    except (RuntimeError, NotImplementedError):  # fake tensors under tracing have no data pointer
        return False
    return a0 < b1 and b0 < a1


def check_disjoint(op: str, name: str, t, others: dict) -> None:
    """ValueError naming `name` and the first of `others` (name -> tensor) it overlaps."""
    for other, u in others.items():
        if overlap(t, u):
            raise ValueError(f"{op}: {name} overlaps {other} in memory; pass a separate tensor "
                             f"(the op writes {name} while it reads {other})")
