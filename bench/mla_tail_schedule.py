"""Experiment: MLA 16-head split with a 'tail' of small programs the hardware scheduler hands to
the SMs that finish first (grid (1, B, s_big + n_small): splits < s_big take big_num/big_den of the
tiles in equal chunks, the rest the remaining tiles in small chunks). Split via Triton's JIT (fp32
partials), the merge through aotc's MLA merge (JIT). torch.profiler kernel times, L2 emptied
between calls; output checked against the static schedule's."""
import os, sys, statistics
import torch
import triton
import triton.language as tl
from torch.profiler import ProfilerActivity, profile

LOG2E = tl.constexpr(1.4426950408889634)
from aotc.kernels.decode import mla_spec as S, spec as DS
from aotc.loader.dispatch import run_kernel


@triton.jit(do_not_specialize=["max_pages", "stride_table", "s_big", "big_num", "big_den"])
def tail_split(Q, K, Table, SeqLens, PartO, PartLse, sm_scale, page_shift, max_pages, stride_table, s_big, big_num,
               big_den, stride_qb, stride_qh, stride_kp, stride_kt,
               D_V: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_H: tl.constexpr, TAIL: tl.constexpr):
    b = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    seq_len = tl.maximum(tl.minimum(tl.load(SeqLens + b), max_pages << page_shift), 0)
    if TAIL:
        n_tiles = tl.cdiv(seq_len, BLOCK_N)
        kb = (n_tiles * big_num // big_den) // s_big
        rest = n_tiles - kb * s_big
        ks = tl.cdiv(rest, num_splits - s_big)
        lo_t = tl.where(split < s_big, split * kb, s_big * kb + (split - s_big) * ks)
        hi_t = tl.where(split < s_big, lo_t + kb, tl.minimum(lo_t + ks, n_tiles))
        lo = lo_t * BLOCK_N
        hi = tl.minimum(hi_t * BLOCK_N, seq_len)
    else:
        chunk = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
        lo = split * chunk
        hi = tl.minimum(lo + chunk, seq_len)
    heads = tl.arange(0, BLOCK_H)
    table_row = Table + b.to(tl.int64) * stride_table
    DT: tl.constexpr = Q.dtype.element_ty
    qk_scale = sm_scale * LOG2E
    q_rows = Q + b.to(tl.int64) * stride_qb + heads[:, None].to(tl.int64) * stride_qh
    offs_a = tl.arange(0, BLOCK_A)
    qa = tl.load(q_rows + offs_a[None, :])
    offs_b = BLOCK_A + tl.arange(0, BLOCK_B)
    qb = tl.load(q_rows + offs_b[None, :])
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_A], dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    page_next = tl.load(table_row + ((lo + offs_n) >> page_shift), mask=lo + offs_n < hi, other=0)
    for t0_ in range(lo, hi, BLOCK_N):
        offs_t = t0_ + offs_n
        t_mask = offs_t < hi
        page = page_next.to(tl.int64)
        offs_ahead = offs_t + BLOCK_N
        page_next = tl.load(table_row + (offs_ahead >> page_shift), mask=offs_ahead < hi, other=0)
        slot = (offs_t & ((1 << page_shift) - 1)).to(tl.int64)
        k_row = page * stride_kp + slot * stride_kt
        ka = tl.load(K + k_row[:, None] + offs_a[None, :], mask=t_mask[:, None], other=0)
        qk = tl.dot(qa, tl.trans(ka))
        kb_ = tl.load(K + k_row[:, None] + offs_b[None, :], mask=t_mask[:, None], other=0)
        qk += tl.dot(qb, tl.trans(kb_))
        qk = tl.where(t_mask[None, :], qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
        acc = acc * alpha[:, None] + tl.dot(p.to(DT), ka)
    slot_ids = (b * BLOCK_H + heads).to(tl.int64) * num_splits + split
    offs_v = tl.arange(0, BLOCK_A)
    inv_l = 1.0 / tl.where(l_i > 0, l_i, 1.0)
    tl.store(PartO + slot_ids[:, None] * D_V + offs_v[None, :], acc * inv_l[:, None], mask=(hi > lo))
    lse = tl.where(hi > lo, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    tl.store(PartLse + slot_ids, lse)


def case(batch, ctx, splits, tail=None, reps=20):
    PAGE, D_QK, D_V, H = 64, 576, 512, 16
    g = torch.Generator("cuda").manual_seed(0)
    pages_per = ctx // PAGE
    kv = torch.randn(batch * pages_per, PAGE, 1, D_QK, generator=g, device="cuda").to(torch.bfloat16)
    table = torch.randperm(batch * pages_per, generator=g, device="cuda").view(batch, pages_per).to(torch.int32)
    q = torch.randn(batch, H, D_QK, generator=g, device="cuda").to(torch.bfloat16)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    part_o = torch.empty(batch * H * splits * D_V, device="cuda")
    part_lse = torch.empty(batch * H * splits, device="cuda")
    out = torch.empty(batch, H, D_V, dtype=torch.bfloat16, device="cuda")
    s_big, num, den = tail or (splits, 1, 1)
    ma = S.merge_axes("bf16", D_V, splits)
    mgrid = DS.merge_grid(batch, H, ma)
    flush = torch.ones(64 << 20, dtype=torch.int32, device="cuda")
    sink = torch.empty((), dtype=torch.int64, device="cuda")

    def call():
        tail_split[(1, batch, splits)](q, kv, table, lens, part_o, part_lse, 1 / 24, 6, pages_per, table.stride(0),
                                       s_big, num, den, q.stride(0), q.stride(1), kv.stride(0), kv.stride(1), D_V=D_V,
                                       BLOCK_A=512, BLOCK_B=64, BLOCK_N=32, BLOCK_H=16, TAIL=int(tail is not None),
                                       num_warps=4, num_stages=3)
        run_kernel(S.MERGE, ma, mgrid, [part_o, part_lse, part_lse, out, part_lse, 0, 0, H, splits, out.stride(0),
                                        out.stride(1), 0])
    call()
    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            torch.sum(flush, 0, dtype=torch.int64, out=sink)
            call()
        torch.cuda.synchronize()
    per = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and ("split" in e.name or "merge" in e.name):
            per.setdefault("split" if "split" in e.name else "merge", []).append(e.device_time)
    return {k: statistics.median(v) for k, v in per.items()}, out.clone()


if __name__ == "__main__":
    for batch, ctx, configs in ((32, 4096, ((8, None), (24, (8, 7, 8)), (16, (8, 7, 8)), (24, (8, 3, 4)))),
                                (32, 32768, ((8, None), (24, (8, 15, 16))))):
        ref = None
        for splits, tail in configs:
            t, out = case(batch, ctx, splits, tail)
            if ref is None:
                ref = out
            err = (out.float() - ref.float()).abs().max().item()
            print(f"B{batch}x{ctx} splits {splits:3d} tail {tail}: split {t['split']:.1f} merge {t['merge']:.1f} "
                  f"sum {t['split'] + t['merge']:.1f} us  |out - static| {err:.2e}", flush=True)
