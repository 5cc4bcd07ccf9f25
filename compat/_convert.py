"""The few conversions the compat entry points make: index dtypes and scale forms."""
from __future__ import annotations

import torch


def int32_indices(t, name: str):
    """An int32 index tensor: int32 as is, int64 converted (one copy), anything else TypeError."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype == torch.int32:
        return t
    if t.dtype == torch.int64:
        return t.to(torch.int32)
    raise TypeError(f"{name}: dtype {t.dtype}, expected torch.int32 or torch.int64")


def fp32_scale(s, name: str, device):
    """A scale given as a tensor (any float dtype, as is) or a Python number (a one-element fp32 tensor)."""
    if s is None or isinstance(s, torch.Tensor):
        return s
    if isinstance(s, (int, float)) and not isinstance(s, bool):
        return torch.tensor([float(s)], dtype=torch.float32, device=device)
    raise TypeError(f"{name} must be a tensor, a number or None, got {type(s).__name__}")
