"""Float32 torch reference of the quantized cache formats: per-group absmax int8/int4 codes and
scales as store_kv writes them, int4's packing, and the real values a cache holds.

Written to be read, not to be fast.
"""
from __future__ import annotations

import torch

from .formats import INT_QMAX


def quantize_reference(x: torch.Tensor, fmt: str, group: int, scale_dtype: torch.dtype):
    """Per-group absmax quantization of x [..., head_dim] as store_kv writes it.

    Returns (codes, scales): int8 codes [..., head_dim] in [-qmax, qmax] (not yet packed) and
    scales [..., head_dim // group] in scale_dtype. The scale is absmax / qmax, rounded to
    scale_dtype first so that the codes are computed against the scale that is stored.
    """
    qmax = INT_QMAX[fmt]
    x = x.float()
    codes = torch.zeros(x.shape, dtype=torch.int8, device=x.device)
    scales = torch.zeros(*x.shape[:-1], x.shape[-1] // group, dtype=scale_dtype, device=x.device)
    for g in range(x.shape[-1] // group):
        chunk = x[..., g * group:(g + 1) * group]
        scale = (chunk.abs().amax(-1) / qmax).to(scale_dtype)
        scales[..., g] = scale
        s = scale.float().unsqueeze(-1)
        safe = torch.where(s == 0, torch.ones_like(s), s)  # an all-zero group stores zeros
        codes[..., g * group:(g + 1) * group] = torch.round(chunk / safe).clamp(-qmax, qmax).to(torch.int8)
    return codes, scales


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """int4 codes [..., head_dim] in [-7, 7] -> bytes [..., head_dim // 2]: channel 2i in the
    low nibble, 2i+1 in the high nibble, each stored as code + 7."""
    nib = (codes.to(torch.int16) + 7)
    return (nib[..., 0::2] | (nib[..., 1::2] << 4)).to(torch.uint8).view(torch.int8)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    b = packed.view(torch.uint8).to(torch.int16)
    return torch.stack([(b & 0xF) - 7, (b >> 4) - 7], dim=-1).flatten(-2)


def dequantize_per_channel(cache: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """An int8 cache [..., kv_heads, head_dim] with one scale a KV head and channel, scale
    [kv_heads, head_dim]: codes * scale[head, channel], float32."""
    return cache.float() * scale.float()


def dequantize(cache: torch.Tensor, fmt: str, scale: torch.Tensor | None = None) -> torch.Tensor:
    """The real values a cache holds, float32, shaped [..., head_dim].

    int8/int4: scale [..., head_dim // group] per group; fp8: scale a scalar or one per kv head
    (the cache's second-to-last dim); fp16/bf16: scale unused.
    """
    if fmt in ("fp16", "bf16"):
        return cache.float()
    if fmt in ("fp8_e4m3", "fp8_e5m2"):
        s = torch.ones((), device=cache.device) if scale is None else scale.float()
        if s.dim() == 1:
            s = s.view(-1, 1)  # per kv head, broadcast over head_dim
        return cache.float() * s
    codes = unpack_int4(cache) if fmt == "int4" else cache.to(torch.int16)
    group = codes.shape[-1] // scale.shape[-1]
    return (codes.float().unflatten(-1, (-1, group)) * scale.float().unsqueeze(-1)).flatten(-2)
