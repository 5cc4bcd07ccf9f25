"""Multiprocessor count of a CUDA device, read from torch once per device index: ops size their
grids and tiles by it (decode's split count and tile, the gated delta state pass's value tile)."""
from __future__ import annotations

import torch

_counts: dict[int, int] = {}


def cuda_sm_count(device: torch.device) -> int:
    """SMs of a CUDA device (index None: the current device), cached per index."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _counts:
        _counts[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _counts[idx]
