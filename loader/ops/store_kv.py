"""`store_kv`: write new tokens into a KV cache in the format `decode` reads (int8/int4 with
per-group absmax scales, fp8 saturated, fp16/bf16 copied). Plain torch, no Triton kernel.

Declared once as `STORE_KV` (library.Op): the `torch.ops.aotc.store_kv` op (mutating the cache and
scales) and its fake follow from it, so `torch.compile(fullgraph=True)` traces through it. Rules
(`_check_store`, the cache checks of kv_cache.py), then the write; no plan, no kernel launch.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import guards, library, rules
from .kv_cache import FP8_DTYPES, KV, check_cache
from .value_checks import skip_value_checks

OP = "store_kv"

_QMAX = {"int8": 127.0, "int4": 7.0}
_FP8_MAX = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}


class _Store:
    """A checked store_kv call."""

    __slots__ = ("k", "v", "kv", "slots", "k_scale", "v_scale", "cache_dtype")

    def __init__(self, k, v, kv, slots, k_scale, v_scale, cache_dtype):
        self.k, self.v, self.kv, self.slots = k, v, kv, slots
        self.k_scale, self.v_scale, self.cache_dtype = k_scale, v_scale, cache_dtype


def _check_store(k, v, k_cache, v_cache, slots, k_scale, v_scale, kv_format, scale_layout="group") -> _Store:
    # a cache written in place would join the autograd graph, and the gradient of k and v would be lost
    guards.refuse_grad(OP, k=k, v=v, k_cache=k_cache, v_cache=v_cache, k_scale=k_scale, v_scale=v_scale)
    rules.tensor(OP, "k", k, (torch.float16, torch.bfloat16), dim=3)
    dev = k.device
    rules.tensor(OP, "v", v, (k.dtype,), dim=3, device=dev)
    if v.shape != k.shape:
        raise ValueError(f"v: shape {tuple(v.shape)}, expected k's {tuple(k.shape)}")
    tokens, kv_heads, head_dim = k.shape
    if head_dim % 2:
        raise ValueError(f"k: head_dim {head_dim} must be even")
    kv = check_cache(OP, k_cache, v_cache, k_scale, v_scale, kv_format, head_dim, dev, scale_layout)
    if kv.k.shape[2] != kv_heads:
        raise ValueError(f"k: {kv_heads} kv heads, but the cache has {kv.k.shape[2]}")
    rules.tensor(OP, "slots", slots, (torch.int32,), dim=1, device=dev)
    if slots.shape[0] != tokens:
        raise ValueError(f"slots: expected [tokens={tokens}], got {tuple(slots.shape)}")
    # Each written tensor apart from everything else: one cache passed twice would get v over k.
    written = {"k_cache": k_cache, "v_cache": v_cache}
    read = {"k": k, "v": v, "slots": slots}
    if kv.fmt in _QMAX:  # int8/int4 write their scales; fp8 only reads them (one tensor may serve both)
        written.update(k_scale=k_scale, v_scale=v_scale)
    else:
        read.update(k_scale=k_scale, v_scale=v_scale)
    guards.check_outputs(OP, written, read)
    return _Store(k, v, kv, slots, k_scale, v_scale, k_cache.dtype)


def _quantize(x: torch.Tensor, qmax: float, group: int, scale_dtype: torch.dtype):
    """Per-group absmax codes (int8, not packed) and scales, the codes taken against the stored scale."""
    xg = x.float().unflatten(-1, (-1, group))
    scale = (xg.abs().amax(-1, keepdim=True) / qmax).to(scale_dtype)
    codes = (xg / scale.float().clamp_min(torch.finfo(torch.float32).tiny)).round().clamp(-qmax, qmax)
    return codes.to(torch.int8).flatten(-2), scale.squeeze(-1)


def _encode(x: torch.Tensor, kv: KV, scale: Optional[torch.Tensor], cache_dtype: torch.dtype):
    """x [tokens, kv_heads, head_dim] in the cache's format: (stored values, their scales or None)."""
    if kv.fmt in ("fp16", "bf16"):
        return x.to(cache_dtype), None
    if kv.fmt in FP8_DTYPES:
        s = torch.ones((), device=x.device) if scale is None else scale.float().reshape(-1, 1)
        lim = _FP8_MAX[kv.fmt]  # out-of-range values would become NaN in e4m3: saturate instead
        return (x.float() / s).clamp(-lim, lim).to(FP8_DTYPES[kv.fmt]).view(cache_dtype), None
    if kv.channel:  # int8, fixed scales [kv_heads, head_dim]: codes only
        codes = (x.float() / scale.float().clamp_min(torch.finfo(torch.float32).tiny)).round().clamp(-127, 127)
        return codes.to(torch.int8).view(cache_dtype), None
    codes, scales = _quantize(x, _QMAX[kv.fmt], kv.group, scale.dtype)
    if kv.fmt == "int4":
        nib = (codes + 7).to(torch.uint8)
        codes = nib[..., 0::2] | (nib[..., 1::2] << 4)
    return codes.view(cache_dtype), scales


def _run_store(k, v, kv: KV, slots, k_scale, v_scale, cache_dtype) -> None:
    page_size = kv.k.shape[1]
    page, off = (slots // page_size).long(), (slots % page_size).long()
    for x, cache, scale, scales_4d in ((k, kv.k, k_scale, kv.ks), (v, kv.v, v_scale, kv.vs)):
        values, scales = _encode(x, kv, scale, cache_dtype)
        cache[page, off] = values
        if scales is not None:
            scales_4d[page, off] = scales


def _check_values(slots, kv: KV, k_scale, v_scale) -> None:
    """On host copies (one device sync): every slot inside the cache and none twice (which of two
    tokens would be stored is undefined); fp8 scales finite and > 0 (x / 0 is inf or NaN)."""
    if slots.numel() == 0 or skip_value_checks(slots):
        return
    n = kv.k.shape[0] * kv.k.shape[1]
    host = slots.cpu()
    bad = (host < 0) | (host >= n)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"slots[{i}] = {int(host[i])} is outside the cache's {n} token slots")
    values, counts = host.unique(return_counts=True)
    if bool((counts > 1).any()):
        slot = int(values[counts > 1][0])
        i, j = (host == slot).nonzero().flatten().tolist()[:2]
        raise ValueError(f"slots[{i}] and slots[{j}] are both slot {slot}; each slot may be written once a call")
    if kv.fmt in FP8_DTYPES:
        for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
            if scale is not None:
                s = scale.detach().float().cpu().reshape(-1)
                bad = ~torch.isfinite(s) | (s <= 0)
                if bool(bad.any()):
                    i = int(bad.nonzero()[0, 0])
                    raise ValueError(f"{name}[{i}] = {float(s[i])}: an fp8 scale must be finite and > 0 "
                                     f"(the cache stores x / scale)")


def _run_store_op(s: _Store) -> None:
    _run_store(s.k, s.v, s.kv, s.slots, s.k_scale, s.v_scale, s.cache_dtype)


STORE_KV = library.Op(
    "store_kv(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slots, Tensor(c!)? k_scale, "
    "Tensor(d!)? v_scale, str kv_format, str scale_layout=\"group\") -> ()", check=_check_store, run=_run_store_op)


def store_kv(k, v, k_cache, v_cache, slots, *, k_scale=None, v_scale=None, kv_format="auto",
             scale_layout="group", validate=True) -> None:
    """Write new tokens into a cache in the format `decode` reads.

    k, v      [T, Hk, D] fp16 or bf16.
    k_cache, v_cache, k_scale, v_scale, kv_format: as for `decode` (D from k). int8/int4: each
              group of `group` channels of a token and head gets scale = absmax / 127 (int8) or
              / 7 (int4), stored in the scale tensor's dtype; codes = round-to-nearest(x / scale)
              clamped to +-127 / +-7 against that stored scale. fp8: x / scale (scalar or per kv
              head, default 1.0) saturated to the format's range. fp16/bf16: a copy.
    scale_layout  "group", or "channel" (int8: fixed scales [Hk, D] fp32, read, never written:
              codes = round-to-nearest(x / scale[head, channel]) clamped to +-127).
    slots     [T] int32 global token slots, slot = page * page_size + offset.
    validate  check slots against the cache and each slot named once, and fp8 scales finite
              and > 0 (one device sync; skipped under torch.compile and CUDA graph capture).

    Errors: TypeError / ValueError naming the argument, before anything is written; a cache or
              scale that shares memory with another argument (v_cache=k_cache) or is an expand()ed
              (stride-0) view is refused; an input that requires grad while grad mode is on raises
              NotImplementedError (aotc is inference-only).
              NaN/inf in k or v are not checked: fp16/bf16/fp8 store them as they are (fp8
              saturates inf); int8/int4 store a NaN scale for their group, so decode reads NaN.
    """
    if torch.compiler.is_compiling():
        STORE_KV(k, v, k_cache, v_cache, slots, k_scale, v_scale, kv_format, scale_layout)
        return
    checked = _check_store(k, v, k_cache, v_cache, slots, k_scale, v_scale, kv_format, scale_layout)
    if validate:
        _check_values(slots, checked.kv, k_scale, v_scale)
    _run_store_op(checked)
