"""Random prefix-prefill problems with poisoned memory, shared by the CPU and GPU tests and the bench.

Pages no request uses hold NaN, so do the unused slots of each request's last page; block
table entries past a request's pages point at a NaN page; the block table's last row ends at
the end of its allocation. A kernel that reads a key it should not, or multiplies a masked
probability by a value it should not have loaded, returns NaN. int8/int4 codes cannot be NaN:
there the unused slots hold the largest code and, with one scale a token, a NaN scale.
"""
from __future__ import annotations

import torch

from aotc.kernels.common.quant_reference import INT_QMAX, pack_int4, quantize_reference

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
# Absolute + relative tolerance on outputs of magnitude ~1 against the float32 reference: the
# kernel rounds P to the input dtype before the PV product (2^-11 for fp16, 2^-8 for bf16).
TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2}


def to_vllm_layout(k_nhd: torch.Tensor, v_nhd: torch.Tensor, x: int | None = None):
    """[blocks, bs, heads, D] -> K [blocks, heads, D // x, bs, x], V [blocks, heads, D, bs];
    x = 16 // element size unless given."""
    nb, bs, h, d = k_nhd.shape
    x = x or 16 // k_nhd.element_size()
    k = k_nhd.view(torch.uint8).view(nb, bs, h, d // x, x * k_nhd.element_size())
    k = k.permute(0, 2, 3, 1, 4).contiguous().view(k_nhd.dtype).view(nb, h, d // x, bs, x)
    v = v_nhd.view(torch.uint8).view(nb, bs, h, d, v_nhd.element_size())
    v = v.permute(0, 2, 3, 1, 4).contiguous().view(v_nhd.dtype).view(nb, h, d, bs)
    return k, v


def _quantize_int(cache, used, fmt, scales, scale_dtype, head_gain, group):
    """(codes, scales) of a float cache [blocks, bs, heads, D] in decode's int8/int4 format, unused
    slots poisoned (largest code; NaN token and group scales)."""
    qmax = INT_QMAX[fmt]
    x = torch.where(used[:, :, None, None], cache, torch.zeros(()))
    if scales in ("token", "group"):
        group = x.shape[-1] if scales == "token" else group
        codes, s = quantize_reference(x, fmt, group, scale_dtype)  # s [blocks, bs, heads, D // group]
        s[~used] = float("nan")
    else:  # one scale a kv head and channel, over the tokens in use
        s = (x.abs().amax(dim=(0, 1)) / qmax).clamp_min(1e-3 * head_gain[:, None]).to(scale_dtype)
        codes = torch.round(x / s.float()).clamp(-qmax, qmax).to(torch.int8)
    codes[~used] = qmax
    return (pack_int4(codes) if fmt == "int4" else codes), s


def random_block_table(lengths, block_size, generator, spare=2):
    """(block_table [len(lengths), max pages] int32 of distinct random pages, num_blocks): each
    sequence's pages drawn from a shuffled pool with `spare` pages never used."""
    pages = [-(-n // block_size) for n in lengths]
    num_blocks = sum(pages) + spare
    order = torch.randperm(num_blocks, generator=generator)
    table = torch.zeros(len(lengths), max(pages + [1]), dtype=torch.int32)
    i = 0
    for b, n in enumerate(pages):
        table[b, :n] = order[i:i + n].to(torch.int32)
        i += n
    return table, num_blocks


def make_case(ctx_lens, q_lens, *, q_heads=4, kv_heads=2, head_dim=64, block_size=16, dtype=torch.float16,
              layout="nhd", cache_dtype=None, device="cpu", seed=0, scale=1.0, kv_format=None, scales="token",
              scale_dtype=torch.float32, head_gain=None, x=None, group=16):
    """Keyword arguments for prefix_prefill (positional ones under their names) plus `kw` options.

    kv_format "int8"/"int4": a quantized cache with `scales` "token", "group" (of `group` channels)
    or "channel" in scale_dtype.
    layout "hnd": head-major caches (and token scales). head_gain [kv_heads]: each kv head's keys
    and values times its gain, its queries divided by it (scales then differ by kv head, logits
    do not grow). x: the vllm layout's K group."""
    g = torch.Generator().manual_seed(seed)
    cache_dtype = cache_dtype or dtype
    tokens = sum(q_lens)

    def randn(*shape):
        return torch.randn(*shape, generator=g) * scale

    q = randn(tokens, q_heads, head_dim).to(dtype)
    k = randn(tokens, kv_heads, head_dim).to(dtype)
    v = randn(tokens, kv_heads, head_dim).to(dtype)
    pages = [-(-c // block_size) for c in ctx_lens]
    spare = 2
    num_blocks = sum(pages) + spare
    order = torch.randperm(num_blocks, generator=g)
    poison_page = int(order[-1])
    width = max(pages + [1])
    table = torch.full((len(ctx_lens), width), poison_page, dtype=torch.int32)
    k_cache = randn(num_blocks, block_size, kv_heads, head_dim)
    v_cache = randn(num_blocks, block_size, kv_heads, head_dim)
    if head_gain is not None:
        head_gain = torch.as_tensor(head_gain, dtype=torch.float32)
        k_cache, v_cache = k_cache * head_gain[:, None], v_cache * head_gain[:, None]
        k = (k.float() * head_gain[:, None]).to(dtype)
        v = (v.float() * head_gain[:, None]).to(dtype)
        # Queries of the group divided by its gain: logits stay O(1) (fp16/bf16 attention's error
        # grows with the logits' size, whatever the cache), while the scales differ by kv head.
        q = (q.float() / head_gain.repeat_interleave(q_heads // kv_heads)[:, None]).to(dtype)
    else:
        head_gain = torch.ones(kv_heads)
    used = torch.zeros(num_blocks, block_size, dtype=torch.bool)
    i = 0
    for b, (n, c) in enumerate(zip(pages, ctx_lens)):
        table[b, :n] = order[i:i + n].to(torch.int32)
        for j in range(n):
            used[order[i + j], : min(block_size, c - j * block_size)] = True
        i += n
    kw = dict(kv_layout=layout)
    if kv_format in ("int8", "int4"):
        k_cache, kw["k_scale"] = _quantize_int(k_cache, used, kv_format, scales, scale_dtype, head_gain, group)
        v_cache, kw["v_scale"] = _quantize_int(v_cache, used, kv_format, scales, scale_dtype, head_gain, group)
        kw["kv_format"] = kv_format
    else:
        k_cache[~used] = float("nan")
        v_cache[~used] = float("nan")
        k_cache, v_cache = k_cache.to(cache_dtype), v_cache.to(cache_dtype)
    if layout == "vllm":
        k_cache, v_cache = to_vllm_layout(k_cache, v_cache, x)
    elif layout == "hnd":
        k_cache, v_cache = k_cache.transpose(1, 2).contiguous(), v_cache.transpose(1, 2).contiguous()
        if kv_format in ("int8", "int4") and scales in ("token", "group"):
            kw["k_scale"] = kw["k_scale"].transpose(1, 2).contiguous()
            kw["v_scale"] = kw["v_scale"].transpose(1, 2).contiguous()
    qsl = torch.tensor([0] + torch.tensor(list(q_lens)).cumsum(0).tolist(), dtype=torch.int32)
    seq_lens = torch.tensor([c + n for c, n in zip(ctx_lens, q_lens)], dtype=torch.int32)
    case = dict(q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache, block_table=table, query_start_loc=qsl,
                seq_lens=seq_lens)
    if cache_dtype in FP8:
        kw["k_scale"] = torch.rand(1, generator=g) + 0.5
        kw["v_scale"] = torch.rand(1, generator=g) + 0.5
    case = {n: t.to(device) for n, t in case.items()}
    kw = {n: t.to(device) if isinstance(t, torch.Tensor) else t for n, t in kw.items()}
    return case, kw


def assert_matches(out: torch.Tensor, ref: torch.Tensor, dtype, rows=None):
    """Kernel output (any float dtype) against the float32 reference, at TOL[dtype]."""
    tol = TOL[dtype]
    got, want = out.float(), ref.float()
    if rows is not None:
        got, want = got[rows], want[rows]
    assert not got.isnan().any(), f"{int(got.isnan().sum())} NaN outputs"
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
