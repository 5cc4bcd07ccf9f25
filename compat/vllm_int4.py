"""vLLM 0.33.0's INT4_PER_TOKEN_HEAD cache writer, `reshape_and_cache_int4` (vllm/v1/attention/ops/
int4_per_token_head.py), with its signature, in torch: the format's reference writer
(kernels/common/int4_rht.write: rotation rounded to the key's dtype, asymmetric nibbles, the zero
point in the scale word) gathered into the paged cache by slot. Host-side torch, not a kernel:
what vLLM's tests call to fill the caches `unified_attention` reads.
"""
from __future__ import annotations

import torch


def _check(name, t, dtypes, dim):
    if not isinstance(t, torch.Tensor) or t.dtype not in dtypes or t.dim() != dim:
        raise TypeError(f"reshape_and_cache_int4: {name} must be a {dim}-D tensor of "
                        f"{' or '.join(map(str, dtypes))}, got {getattr(t, 'dtype', type(t).__name__)} "
                        f"{tuple(getattr(t, 'shape', ()))}")


def reshape_and_cache_int4(key, value, key_cache, value_cache, slot_mapping, *, k_scale_cache, v_scale_cache) -> None:
    """key, value [tokens, kv_heads, D] (D even); key_cache, value_cache [num_blocks, block_size,
    kv_heads, >= D // 2] uint8 (the first D // 2 bytes are written); k_scale_cache, v_scale_cache
    [num_blocks, block_size, kv_heads] float32; slot_mapping [tokens] (block * block_size + offset,
    negative: skipped)."""
    from aotc.kernels.common.int4_rht import write

    floats = (torch.float16, torch.bfloat16, torch.float32)
    _check("key", key, floats, 3)
    _check("value", value, floats, 3)
    for name, t in (("key_cache", key_cache), ("value_cache", value_cache)):
        _check(name, t, (torch.uint8, torch.int8), 4)
    for name, t in (("k_scale_cache", k_scale_cache), ("v_scale_cache", v_scale_cache)):
        _check(name, t, (torch.float32,), 3)
    tokens, heads, d = key.shape
    if d % 2 or value.shape != key.shape:
        raise ValueError(f"reshape_and_cache_int4: key/value must be [tokens, kv_heads, even D] alike, got "
                         f"{tuple(key.shape)} / {tuple(value.shape)}")
    nb, bs = key_cache.shape[:2]
    for name, t in (("key_cache", key_cache), ("value_cache", value_cache)):
        if t.shape[2] != heads or t.shape[3] < d // 2:
            raise ValueError(f"reshape_and_cache_int4: {name} must be [blocks, block_size, {heads}, >= {d // 2}], "
                             f"got {tuple(t.shape)}")
    for name, t in (("k_scale_cache", k_scale_cache), ("v_scale_cache", v_scale_cache)):
        if tuple(t.shape) != tuple(key_cache.shape[:3]):
            raise ValueError(f"reshape_and_cache_int4: {name} must be {list(key_cache.shape[:3])}, "
                             f"got {tuple(t.shape)}")
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != tokens:
        raise ValueError(f"reshape_and_cache_int4: slot_mapping must be [{tokens}], got {tuple(slot_mapping.shape)}")
    slots = slot_mapping.long()
    keep = slots >= 0
    if bool((slots[keep] >= nb * bs).any()):
        raise ValueError(f"reshape_and_cache_int4: slot_mapping has slots past the cache's {nb * bs}")
    blk, off = slots[keep] // bs, slots[keep] % bs
    for x, cache, scales in ((key, key_cache, k_scale_cache), (value, value_cache, v_scale_cache)):
        packed, words = write(x[keep])
        cache[blk, off, :, :d // 2] = packed.view(cache.dtype)
        scales[blk, off] = words
