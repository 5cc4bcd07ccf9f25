"""The few conversions the compat entry points make (index dtypes and scale forms), and the
guards they run on the engine's own arguments before converting any of them."""
from __future__ import annotations

import torch

from aotc.loader.ops import guards
from aotc.loader.ops.value_checks import skip_value_checks


def guard_call(who: str, outputs: dict, inputs: dict) -> None:
    """The ops' guards on the caller's tensors, by the engine's names: no input requiring grad in
    grad mode (NotImplementedError), outputs neither expand()ed nor sharing memory with another
    argument (ValueError). Run before any conversion, whose copies would hide an overlap."""
    guards.refuse_grad(who, **outputs, **inputs)
    guards.check_outputs(who, outputs, inputs)


def int32_indices(t, name: str, validate: bool | None = None):
    """An int32 index tensor: int32 as is, int64 converted (one copy) after its values are checked
    to fit int32 (a wrapped page id or length would pass the op's own checks; one device sync,
    skipped under torch.compile and graph capture, or with validate=False), else TypeError."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype == torch.int32:
        return t
    if t.dtype == torch.int64:
        if validate or (validate is None and not skip_value_checks(t)):
            guards.check_int32_range("aotc.compat", name, t)
        return t.to(torch.int32)
    raise TypeError(f"{name}: dtype {t.dtype}, expected torch.int32 or torch.int64")


def fp32_scale(s, name: str, device):
    """A scale given as a tensor (any float dtype, as is) or a Python number (a one-element fp32 tensor)."""
    if s is None or isinstance(s, torch.Tensor):
        return s
    if isinstance(s, (int, float)) and not isinstance(s, bool):
        return torch.tensor([float(s)], dtype=torch.float32, device=device)
    raise TypeError(f"{name} must be a tensor, a number or None, got {type(s).__name__}")
