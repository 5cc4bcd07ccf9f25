"""Random prefix-prefill problems with poisoned memory, shared by the CPU and GPU tests and the bench.

Pages no request uses hold NaN, so do the unused slots of each request's last page; block
table entries past a request's pages point at a NaN page; the block table's last row ends at
the end of its allocation. A kernel that reads a key it should not, or multiplies a masked
probability by a value it should not have loaded, returns NaN.
"""
from __future__ import annotations

import torch

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
# Absolute + relative tolerance on outputs of magnitude ~1 against the float32 reference: the
# kernel rounds P to the input dtype before the PV product (2^-11 for fp16, 2^-8 for bf16).
TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2}


def to_vllm_layout(k_nhd: torch.Tensor, v_nhd: torch.Tensor):
    """[blocks, bs, heads, D] -> K [blocks, heads, D // x, bs, x], V [blocks, heads, D, bs]."""
    nb, bs, h, d = k_nhd.shape
    x = 16 // k_nhd.element_size()
    k = k_nhd.view(torch.uint8).view(nb, bs, h, d // x, x * k_nhd.element_size())
    k = k.permute(0, 2, 3, 1, 4).contiguous().view(k_nhd.dtype).view(nb, h, d // x, bs, x)
    v = v_nhd.view(torch.uint8).view(nb, bs, h, d, v_nhd.element_size())
    v = v.permute(0, 2, 3, 1, 4).contiguous().view(v_nhd.dtype).view(nb, h, d, bs)
    return k, v


def make_case(ctx_lens, q_lens, *, q_heads=4, kv_heads=2, head_dim=64, block_size=16, dtype=torch.float16,
              layout="nhd", cache_dtype=None, device="cpu", seed=0, scale=1.0):
    """Keyword arguments for prefix_prefill (positional ones under their names) plus `kw` options."""
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
    used = torch.zeros(num_blocks, block_size, dtype=torch.bool)
    i = 0
    for b, (n, c) in enumerate(zip(pages, ctx_lens)):
        table[b, :n] = order[i:i + n].to(torch.int32)
        for j in range(n):
            used[order[i + j], : min(block_size, c - j * block_size)] = True
        i += n
    k_cache[~used] = float("nan")
    v_cache[~used] = float("nan")
    k_cache, v_cache = k_cache.to(cache_dtype), v_cache.to(cache_dtype)
    if layout == "vllm":
        k_cache, v_cache = to_vllm_layout(k_cache, v_cache)
    qsl = torch.tensor([0] + torch.tensor(list(q_lens)).cumsum(0).tolist(), dtype=torch.int32)
    seq_lens = torch.tensor([c + n for c, n in zip(ctx_lens, q_lens)], dtype=torch.int32)
    case = dict(q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache, block_table=table, query_start_loc=qsl,
                seq_lens=seq_lens)
    kw = dict(kv_layout=layout)
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
