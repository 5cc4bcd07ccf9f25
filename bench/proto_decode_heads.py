"""Prototype (JIT only, not in the build): decode's int8/int4 split kernel with one scale a token
reading HEADS neighbouring KV heads a program, so that a program's tile holds HEADS * head_dim
(int4: / 2) contiguous bytes of each token, the read pattern probe_decode_read.py found at the copy
bandwidth. The math per KV head is decode's `_attend_chunked` (PER_TOKEN): exact dots over biased
codes scaled after the dot, V's scale on the probabilities; the heads' states are tuples carried
through one tile loop. Token-major or head-major caches (any strides), no window, sinks, softcap or
request indices (the op's other features). Partials as decode's split kernel writes them, merged by
decode_merge_kernel. `bench` times it beside loader.decode (JIT) on the same inputs."""
from __future__ import annotations

import argparse
import math
import os
import sys

import triton
import triton.language as tl

from aotc.kernels.common.dequant import _i4x4_codes16, _i8x2_codes
from aotc.kernels.decode.kernel import LOG2E, _chunk_scales, _code_dots, _pages, _softmax_step, _words


@triton.jit(do_not_specialize=["sm_scale", "page_shift", "max_pages", "q_heads", "group"])
def heads_split_kernel(
    Q, K, V, KS, VS, Table, SeqLens, PartO, PartLse,
    sm_scale, page_shift, max_pages, q_heads, group,
    stride_qb, stride_qh, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
    stride_ksp, stride_kst, stride_ksh, stride_vsp, stride_vst, stride_vsh,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr, HEADS: tl.constexpr,
    KV_KIND: tl.constexpr, PTX: tl.constexpr,
):
    # Program (g, b, s): KV heads [g * HEADS, (g + 1) * HEADS) of request b, split s.
    g = tl.program_id(0)
    b = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    seq_len = tl.maximum(tl.minimum(tl.load(SeqLens + b), max_pages << page_shift), 0)
    chunk = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, seq_len)
    table_row = Table + b.to(tl.int64) * max_pages
    INT4: tl.constexpr = KV_KIND == 2
    PARTS: tl.constexpr = 4 if INT4 else 2
    CW: tl.constexpr = HEAD_DIM // PARTS
    offs_w = tl.arange(0, CW)
    w_mask = offs_w < CW
    offs_h = tl.arange(0, BLOCK_H)
    h_mask = offs_h < group
    qk_scale = sm_scale * LOG2E
    K16 = K.to(tl.pointer_type(tl.int16))
    V16 = V.to(tl.pointer_type(tl.int16))

    qs = ()
    k_bias = ()
    acc = ()
    ms = ()
    ls = ()
    for hh in tl.static_range(HEADS):
        heads = (g * HEADS + hh) * group + offs_h
        q_cols = Q + b.to(tl.int64) * stride_qb + heads[:, None].to(tl.int64) * stride_qh + PARTS * offs_w[None, :]
        qm = h_mask[:, None]
        q0 = tl.load(q_cols, mask=qm, other=0.0).to(tl.float16)
        q1 = tl.load(q_cols + 1, mask=qm, other=0.0).to(tl.float16)
        if INT4:
            q2 = tl.load(q_cols + 2, mask=qm, other=0.0).to(tl.float16)
            q3 = tl.load(q_cols + 3, mask=qm, other=0.0).to(tl.float16)
            qs = qs + ((q0, q1, q2, q3),)
            s02 = tl.sum(q0.to(tl.float32), 1) + tl.sum(q2.to(tl.float32), 1)
            s13 = tl.sum(q1.to(tl.float32), 1) + tl.sum(q3.to(tl.float32), 1)
            k_bias = k_bias + (1031.0 * s02 + 71.0 * s13,)
        else:
            qs = qs + ((q0, q1),)
            k_bias = k_bias + (1152.0 * (tl.sum(q0.to(tl.float32), 1) + tl.sum(q1.to(tl.float32), 1)),)
        for i in tl.static_range(PARTS):
            acc = acc + (tl.zeros([BLOCK_H, CW], dtype=tl.float32),)
        ms = ms + (tl.full([BLOCK_H], float("-inf"), dtype=tl.float32),)
        ls = ls + (tl.zeros([BLOCK_H], dtype=tl.float32),)

    # Scales a tile ahead (decode's _attend_chunked), one [BLOCK_N] vector a head.
    offs_n = lo + tl.arange(0, BLOCK_N)
    page_n = _pages(table_row, offs_n, hi, page_shift)
    ks = ()
    vs = ()
    for hh in tl.static_range(HEADS):
        kvh64 = (g * HEADS + hh).to(tl.int64)
        ks = ks + _chunk_scales(KS + kvh64 * stride_ksh, page_n, offs_n, hi, page_shift, stride_ksp, stride_kst, 0,
                                1, HEAD_DIM, tl.float32)
        vs = vs + _chunk_scales(VS + kvh64 * stride_vsh, page_n, offs_n, hi, page_shift, stride_vsp, stride_vst, 0,
                                1, HEAD_DIM, tl.float16)
    page_n = _pages(table_row, offs_n + BLOCK_N, hi, page_shift)
    for t0 in range(lo, hi, BLOCK_N):
        offs_t = t0 + tl.arange(0, BLOCK_N)
        t_mask = offs_t < hi
        offs_n = offs_t + BLOCK_N
        ks_next = ()
        vs_next = ()
        for hh in tl.static_range(HEADS):
            kvh64 = (g * HEADS + hh).to(tl.int64)
            ks_next = ks_next + _chunk_scales(KS + kvh64 * stride_ksh, page_n, offs_n, hi, page_shift, stride_ksp,
                                              stride_kst, 0, 1, HEAD_DIM, tl.float32)
            vs_next = vs_next + _chunk_scales(VS + kvh64 * stride_vsh, page_n, offs_n, hi, page_shift, stride_vsp,
                                              stride_vst, 0, 1, HEAD_DIM, tl.float16)
        page_n = _pages(table_row, offs_n + BLOCK_N, hi, page_shift)
        page = _pages(table_row, offs_t, hi, page_shift)
        new_acc = ()
        new_m = ()
        new_l = ()
        for hh in tl.static_range(HEADS):
            kvh64 = (g * HEADS + hh).to(tl.int64)
            kx = _words(K16, page, offs_t, hi, page_shift, kvh64, stride_kp, stride_kt, stride_kh, offs_w, w_mask)
            qk = (_code_dots(qs[hh], kx, INT4, PTX) - k_bias[hh][:, None]) * (ks[hh] * qk_scale)[None, :]
            qk = tl.where(t_mask[None, :], qk, float("-inf"))
            p, alpha, m_i, l_i = _softmax_step(qk, ms[hh], ls[hh])
            vx = _words(V16, page, offs_t, hi, page_shift, kvh64, stride_vp, stride_vt, stride_vh, offs_w, w_mask)
            pd = (p * vs[hh].to(tl.float32)[None, :]).to(tl.float16)
            if INT4:
                v0, v1, v2, v3 = _i4x4_codes16(vx, PTX)
                a2 = acc[PARTS * hh + 2] * alpha[:, None] + tl.dot(pd, v2)
                a3 = acc[PARTS * hh + 3] * alpha[:, None] + tl.dot(pd, v3)
                new_acc = new_acc + (acc[PARTS * hh] * alpha[:, None] + tl.dot(pd, v0),
                                     acc[PARTS * hh + 1] * alpha[:, None] + tl.dot(pd, v1), a2, a3)
            else:
                v0, v1 = _i8x2_codes(vx, PTX)
                new_acc = new_acc + (acc[PARTS * hh] * alpha[:, None] + tl.dot(pd, v0),
                                     acc[PARTS * hh + 1] * alpha[:, None] + tl.dot(pd, v1))
            new_m = new_m + (m_i,)
            new_l = new_l + (l_i,)
        acc = new_acc
        ms = new_m
        ls = new_l
        ks = ks_next
        vs = vs_next

    for hh in tl.static_range(HEADS):
        heads = (g * HEADS + hh) * group + offs_h
        slot_ids = (b * q_heads + heads).to(tl.int64) * num_splits + split
        l_i = ls[hh]
        inv_l = 1.0 / tl.where(l_i > 0, l_i, 1.0)
        om = (h_mask & (hi > lo))[:, None] & w_mask[None, :]
        o_cols = PartO + slot_ids[:, None] * HEAD_DIM + PARTS * offs_w[None, :]
        for i in tl.static_range(PARTS):
            scale = inv_l * 0.0625 if INT4 and i % 2 == 1 else inv_l
            tl.store(o_cols + i, acc[PARTS * hh + i] * scale[:, None], mask=om)
        lse = tl.where(hi > lo, ms[hh] + tl.log2(tl.where((l_i > 0) | (l_i != l_i), l_i, 1.0)), float("-inf"))
        tl.store(PartLse + slot_ids, lse, mask=h_mask)


@triton.jit(do_not_specialize=["sm_scale", "page_shift", "max_pages", "q_heads", "group"])
def bd_split_kernel(
    Q, K, V, KS, VS, Table, SeqLens, PartO, PartLse,
    sm_scale, page_shift, max_pages, q_heads, group,
    stride_qb, stride_qh, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
    stride_ksp, stride_kst, stride_ksh, stride_vsp, stride_vst, stride_vsh,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr, HEADS: tl.constexpr,
    KV_KIND: tl.constexpr, PTX: tl.constexpr,
):
    # HEADS KV heads a program in one dot each way: the program's HEADS * group query heads are the
    # rows, the HEADS heads' words of a token the columns, q block-diagonal (row r holds its query in
    # its KV head's columns, zeros elsewhere), so QK is exact per row and PV's off-diagonal columns
    # are dropped at the store. The tensor-core work equals HEADS one-head programs (whose 16-row
    # dots carry group real rows); the tile is HEADS heads' contiguous bytes of each token.
    g = tl.program_id(0)
    b = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    seq_len = tl.maximum(tl.minimum(tl.load(SeqLens + b), max_pages << page_shift), 0)
    chunk = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, seq_len)
    table_row = Table + b.to(tl.int64) * max_pages
    INT4: tl.constexpr = KV_KIND == 2
    PARTS: tl.constexpr = 4 if INT4 else 2
    CW: tl.constexpr = HEAD_DIM // PARTS
    WC: tl.constexpr = HEADS * CW
    offs_r = tl.arange(0, BLOCK_H)
    r_mask = offs_r < HEADS * group
    r_head = offs_r // group
    offs_c = tl.arange(0, WC)
    c_head = offs_c // CW
    c_word = offs_c % CW
    diag = (r_head[:, None] == c_head[None, :]) & r_mask[:, None]
    qk_scale = sm_scale * LOG2E
    K16 = K.to(tl.pointer_type(tl.int16))
    V16 = V.to(tl.pointer_type(tl.int16))
    kvh0 = (g * HEADS).to(tl.int64)
    k_cols = c_head.to(tl.int64) * (stride_kh >> 1) + c_word
    v_cols = c_head.to(tl.int64) * (stride_vh >> 1) + c_word
    ks_rows = KS + (kvh0 + r_head)[:, None] * stride_ksh
    vs_rows = VS + (kvh0 + r_head)[:, None] * stride_vsh
    heads = g * HEADS * group + offs_r
    q_cols = Q + b.to(tl.int64) * stride_qb + heads[:, None].to(tl.int64) * stride_qh + PARTS * c_word[None, :]
    q0 = tl.load(q_cols, mask=diag, other=0.0).to(tl.float16)
    q1 = tl.load(q_cols + 1, mask=diag, other=0.0).to(tl.float16)
    if INT4:
        q2 = tl.load(q_cols + 2, mask=diag, other=0.0).to(tl.float16)
        q3 = tl.load(q_cols + 3, mask=diag, other=0.0).to(tl.float16)
        qs = (q0, q1, q2, q3)
        s02 = tl.sum(q0.to(tl.float32), 1) + tl.sum(q2.to(tl.float32), 1)
        s13 = tl.sum(q1.to(tl.float32), 1) + tl.sum(q3.to(tl.float32), 1)
        k_bias = 1031.0 * s02 + 71.0 * s13
    else:
        qs = (q0, q1)
        k_bias = 1152.0 * (tl.sum(q0.to(tl.float32), 1) + tl.sum(q1.to(tl.float32), 1))
    acc = ()
    for i in tl.static_range(PARTS):
        acc = acc + (tl.zeros([BLOCK_H, WC], dtype=tl.float32),)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)

    # Each row's scales of a tile, [BLOCK_H, BLOCK_N] (its KV head's), a tile ahead as decode does.
    offs_n = lo + tl.arange(0, BLOCK_N)
    page_n = _pages(table_row, offs_n, hi, page_shift)
    slot_n = (offs_n & ((1 << page_shift) - 1)).to(tl.int64)
    sm = r_mask[:, None] & (offs_n < hi)[None, :]
    ks = tl.load(ks_rows + (page_n * stride_ksp + slot_n * stride_kst)[None, :], mask=sm, other=0.0).to(tl.float32)
    vs = tl.load(vs_rows + (page_n * stride_vsp + slot_n * stride_vst)[None, :], mask=sm, other=0.0).to(tl.float32)
    page_n = _pages(table_row, offs_n + BLOCK_N, hi, page_shift)
    for t0 in range(lo, hi, BLOCK_N):
        offs_t = t0 + tl.arange(0, BLOCK_N)
        t_mask = offs_t < hi
        offs_n = offs_t + BLOCK_N
        slot_n = (offs_n & ((1 << page_shift) - 1)).to(tl.int64)
        sm = r_mask[:, None] & (offs_n < hi)[None, :]
        ks_next = tl.load(ks_rows + (page_n * stride_ksp + slot_n * stride_kst)[None, :], mask=sm,
                          other=0.0).to(tl.float32)
        vs_next = tl.load(vs_rows + (page_n * stride_vsp + slot_n * stride_vst)[None, :], mask=sm,
                          other=0.0).to(tl.float32)
        page_n = _pages(table_row, offs_n + BLOCK_N, hi, page_shift)
        page = _pages(table_row, offs_t, hi, page_shift)
        kx = _words(K16, page, offs_t, hi, page_shift, kvh0, stride_kp, stride_kt, stride_kh, k_cols, offs_c < WC)
        qk = (_code_dots(qs, kx, INT4, PTX) - k_bias[:, None]) * (ks * qk_scale)
        qk = tl.where(t_mask[None, :], qk, float("-inf"))
        p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i)
        vx = _words(V16, page, offs_t, hi, page_shift, kvh0, stride_vp, stride_vt, stride_vh, v_cols, offs_c < WC)
        pd = (p * vs).to(tl.float16)
        if INT4:
            v0, v1, v2, v3 = _i4x4_codes16(vx, PTX)
            a2 = acc[2] * alpha[:, None] + tl.dot(pd, v2)
            a3 = acc[3] * alpha[:, None] + tl.dot(pd, v3)
            acc = (acc[0] * alpha[:, None] + tl.dot(pd, v0), acc[1] * alpha[:, None] + tl.dot(pd, v1), a2, a3)
        else:
            v0, v1 = _i8x2_codes(vx, PTX)
            acc = (acc[0] * alpha[:, None] + tl.dot(pd, v0), acc[1] * alpha[:, None] + tl.dot(pd, v1))
        ks = ks_next
        vs = vs_next

    slot_ids = (b * q_heads + heads).to(tl.int64) * num_splits + split
    inv_l = 1.0 / tl.where(l_i > 0, l_i, 1.0)
    om = diag & (hi > lo)
    o_cols = PartO + slot_ids[:, None] * HEAD_DIM + PARTS * c_word[None, :]
    for i in tl.static_range(PARTS):
        scale = inv_l * 0.0625 if INT4 and i % 2 == 1 else inv_l
        tl.store(o_cols + i, acc[i] * scale[:, None], mask=om)
    lse = tl.where(hi > lo, m_i + tl.log2(tl.where((l_i > 0) | (l_i != l_i), l_i, 1.0)), float("-inf"))
    tl.store(PartLse + slot_ids, lse, mask=r_mask)


def decode_heads(q, k_cache, v_cache, k_scale, v_scale, table, seq_lens, kv_format, heads, splits, block_n=128,
                 num_warps=4, num_stages=2, out=None, ptx=True, diag=False):
    """loader.decode's result for int8/int4 caches with one scale a token, through the prototype
    split kernel (HEADS KV heads a program) and decode's merge kernel."""
    import torch

    from aotc.kernels.decode import spec
    from aotc.kernels.decode.kernel import decode_merge_kernel

    batch, q_heads, hd = q.shape
    kv_heads = k_cache.shape[2]
    group = q_heads // kv_heads
    page = k_cache.shape[1]
    part_o = torch.empty(batch * q_heads * splits * hd, device=q.device, dtype=torch.float32)
    part_lse = torch.empty(batch * q_heads * splits, device=q.device, dtype=torch.float32)
    out = torch.empty_like(q) if out is None else out
    grid = (kv_heads // heads, batch, splits)
    kernel, block_h = heads_split_kernel, spec.BLOCK_H
    if diag:  # one block-diagonal dot each way (bd_split_kernel)
        kernel, block_h = bd_split_kernel, max(16, 1 << (heads * group - 1).bit_length())
    kernel[grid](
        q, k_cache, v_cache, k_scale, v_scale, table, seq_lens, part_o, part_lse,
        1.0 / math.sqrt(hd), page.bit_length() - 1, table.shape[1], q_heads, group,
        q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3],
        *k_scale.stride()[:3], *v_scale.stride()[:3],
        HEAD_DIM=hd, BLOCK_N=block_n, BLOCK_H=block_h, HEADS=heads, KV_KIND=spec.KV_KIND[kv_format],
        PTX=int(ptx), num_warps=num_warps, num_stages=num_stages)
    axes = spec.merge_axes("bf16" if q.dtype == torch.bfloat16 else "fp16", hd, splits)
    c = spec.merge_constexprs(axes)
    cfg = spec.merge_launch(axes, 80)
    decode_merge_kernel[spec.merge_grid(batch, q_heads, axes)](
        part_o, part_lse, part_lse, out, part_lse, 0, 0, q_heads, splits, out.stride(0), out.stride(1), 0,
        **c, PDL=0, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


def bench():
    """On the GPU: the prototype beside loader.decode (JIT: the AOT binaries' code) on the same
    inputs. Time: one call's kernels summed (torch.profiler; a JIT launch's host time would
    dominate CUDA events), % of copy; outputs compared with decode's."""
    import json

    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_decode import make
    from harness import copy_bandwidth, kernel_time, kernel_times

    from aotc import loader
    from aotc.kernels.decode import spec

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--configs", default="int8:4:32:4:2:d,int8:4:16:4:3:d,int8:4:32:8:2:d,int8:2:64:4:2:d,"
                                         "int4:4:32:4:2:d,int4:4:32:4:3:d,int4:4:16:4:3:d,int4:2:64:4:2:d",
                    help="format:heads:block_n:warps:stages[:d],...; d: the block-diagonal kernel")
    ap.add_argument("--shapes", default="32x8192x16,128x8192x16,32x4096x16")
    a = ap.parse_args()
    copy = copy_bandwidth()
    print(f"copy {copy / 1e9:.0f} GB/s", flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    occupancy = {"int8": 3, "int4": 6}  # programs an SM of decode's binaries (spec.split_launch's notes)

    def emit(row):
        if a.out:
            with open(a.out, "a") as fh:
                fh.write(json.dumps(dict(row, copy_GBps=copy / 1e9)) + "\n")

    for shape in a.shapes.split(","):
        batch, ctx, page = map(int, shape.split("x"))
        for fmt in sorted({c.split(":")[0] for c in a.configs.split(",")}):
            args, kw, nbytes = make(fmt, batch, ctx, 32, 8, 128, page, group=128)
            q, kc, vc, table, lens = args
            out = torch.empty_like(q)
            kt = kernel_times(lambda: loader.decode(*args, **kw, out=out, validate=False))
            t_dec = sum(kt.values())
            ref = out.float().clone()
            dsplits = spec.num_splits(batch, 8, 4, sms, programs_per_sm=occupancy[fmt])
            pct = 100 * nbytes / t_dec / copy
            print(f"b{batch} ctx{ctx} page{page} {fmt}: decode (splits {dsplits}) {t_dec * 1e6:7.1f} us {pct:5.1f}%  "
                  + ", ".join(f"{k[:20]} {v * 1e6:.1f}" for k, v in kt.items()), flush=True)
            emit(dict(fmt=fmt, batch=batch, ctx=ctx, page=page, kernel="decode", splits=dsplits, us=t_dec * 1e6,
                      pct=pct))
            for cfg in a.configs.split(","):
                f, heads, bn, w, st, *d = cfg.split(":")
                if f != fmt:
                    continue
                heads, bn, w, st, diag = int(heads), int(bn), int(w), int(st), d == ["d"]
                for splits in sorted({dsplits * heads, max(1, dsplits * heads // 2)}):
                    o2 = torch.full_like(q, float("nan"))

                    def fn():
                        decode_heads(q, kc, vc, kw["k_scale"], kw["v_scale"], table, lens, fmt, heads, splits, bn, w,
                                     st, out=o2, diag=diag)
                    try:
                        fn()
                        torch.cuda.synchronize()
                        err = ((o2.float() - ref).norm() / ref.norm()).item()
                        t = kernel_time(fn)
                    except Exception as e:  # noqa: BLE001 - one config that fails is reported
                        print(f"  {cfg} splits {splits}: FAILED {type(e).__name__}: {str(e)[:160]}", flush=True)
                        continue
                    pct = 100 * nbytes / t / copy
                    print(f"  {'diag ' if diag else ''}heads {heads} block_n {bn} warps {w} stages {st} splits {splits}: "
                          f"{t * 1e6:7.1f} us "
                          f"{pct:5.1f}%  rel err vs decode {err:.1e}", flush=True)
                    emit(dict(fmt=fmt, batch=batch, ctx=ctx, page=page, kernel="diag" if diag else "proto",
                              heads=heads, block_n=bn, warps=w, stages=st, splits=splits, us=t * 1e6, pct=pct, err=err))
            torch.cuda.empty_cache()


if __name__ == "__main__":
    bench()
