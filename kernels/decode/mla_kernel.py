"""Grouped paged decode whose key and value head sizes may differ (DeepSeek-style MLA and others).

`mla_split_kernel` runs on a grid (kv_heads * cdiv(group, BLOCK_H), batch, num_splits) that
depends on no sequence length, so one CUDA graph serves every step. Program (g, b, s) takes
BLOCK_H query heads of one KV head (the M of both tensor-core dots: [BLOCK_H, D_QK] x [D_QK,
BLOCK_N] for the scores, [BLOCK_H, BLOCK_N] x [BLOCK_N, D_V] for the output) over split s's
contiguous chunk of request b's tokens (rounded up to BLOCK_N: common/schedule.split_tokens, as
decode's). Every program starts from fresh accumulators and writes its own workspace slot; a
split with no tokens writes lse = -inf and no partial. The splits are combined by decode's merge
kernel (its HEAD_DIM = D_V; past 256 splits its looping form), which also adds sinks and writes
the natural-log LSE.

Key channels are two tiles: A, channels [0, BLOCK_A), and B, [BLOCK_A, BLOCK_A + BLOCK_B) (576 =
512 + 64, 192 = 128 + 64), each a power of two masked at D_QK, so no channel beyond D_QK is read
and a 576-channel key costs 576, not 1024, channels of work. LATENT: one cache whose first D_V
channels are the value; the output product takes tile A of the key (BLOCK_DV == BLOCK_A), the
same loaded tile as the scores, so the cache is read once; columns at and past D_V are never
stored. Otherwise V is its own cache [pages, page_size, kv_heads, D_V] with any strides.

KV_KIND 0: fp16/bf16 cache in the query's dtype. 3 / 4: fp8 e4m3 / e5m2 read as raw bytes and
widened to fp16 by decode's integer dequantizer (sm80 has no e4m3 type), one scale for K and one
for V folded into the score and output scales (with e4m3's 2^8 rebias). fp8 dots run in fp16
(a bf16 query converts exactly within fp16's range). Offsets are int64.

PAGE_AHEAD (mla_spec.page_ahead): each tile's page ids are loaded one tile ahead and carried by
the loop, so no load of the tile's own iteration feeds its copy's address and Triton's pipeliner
gives the copy two shared buffers at 3 stages (the next tile arrives during this one's dots).
"""
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from aotc.kernels.common.dequant import _INTERPRET, _fp8_bits_to_fp16
from aotc.kernels.common.schedule import split_program

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _tile(base, row, cols, mask, KV_KIND: tl.constexpr, PTX: tl.constexpr):
    # [rows, cols] of a cache as the dots read it: the query's dtype, or fp16 widened from fp8 bytes.
    x = tl.load(base + row[:, None] + cols[None, :], mask=mask, other=0)
    if KV_KIND == 0:
        return x
    else:
        return _fp8_bits_to_fp16(x, KV_KIND, PTX)


@triton.jit(
    do_not_specialize=["sm_scale", "window", "use_req_idx", "page_shift", "max_pages", "stride_table", "q_heads",
                       "group"],
    do_not_specialize_on_alignment=["KS", "VS", "Table", "ReqIdx", "SeqLens"],
)
def mla_split_kernel(
    Q, K, V, KS, VS, Table, ReqIdx, SeqLens, PartO, PartLse,
    sm_scale, window, use_req_idx, page_shift, max_pages, stride_table, q_heads, group,
    stride_qb, stride_qh, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
    D_QK: tl.constexpr, D_V: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr, LATENT: tl.constexpr, KV_KIND: tl.constexpr,
    PAGE_AHEAD: tl.constexpr, PDL: tl.constexpr, PTX: tl.constexpr,
):
    # PDL (sm90+): scheduled while the previous kernel on the stream drains; nothing is read
    # before griddepcontrol.wait returns (decode's split kernel does the same).
    if PDL and not _INTERPRET:
        gdc_wait()
    b, split, num_splits, kvh, h_mask, heads, lo, hi, _, table_row = split_program(
        SeqLens, Table, ReqIdx, window, use_req_idx, max_pages, page_shift, stride_table, group, BLOCK_N, BLOCK_H)

    DT: tl.constexpr = Q.dtype.element_ty if KV_KIND == 0 else tl.float16
    qk_scale = sm_scale * LOG2E
    v_scale = 1.0
    if KV_KIND >= 3:
        rebias = 256.0 if KV_KIND == 3 else 1.0  # e4m3 bytes widen to value * 2^-8
        qk_scale = qk_scale * tl.load(KS).to(tl.float32) * rebias
        v_scale = tl.load(VS).to(tl.float32) * rebias
    kvh64 = kvh.to(tl.int64)
    q_rows = Q + b.to(tl.int64) * stride_qb + heads[:, None].to(tl.int64) * stride_qh
    offs_a = tl.arange(0, BLOCK_A)
    a_mask = offs_a < D_QK
    qa = tl.load(q_rows + offs_a[None, :], mask=h_mask[:, None] & a_mask[None, :], other=0.0).to(DT)
    if BLOCK_B > 0:
        offs_b = BLOCK_A + tl.arange(0, BLOCK_B)
        b_mask = offs_b < D_QK
        qb = tl.load(q_rows + offs_b[None, :], mask=h_mask[:, None] & b_mask[None, :], other=0.0).to(DT)
    offs_v = tl.arange(0, BLOCK_DV)
    v_mask = offs_v < D_V

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    if PAGE_AHEAD:
        page_next = tl.load(table_row + ((lo + offs_n) >> page_shift), mask=lo + offs_n < hi, other=0)
    for t0 in range(lo, hi, BLOCK_N):
        offs_t = t0 + offs_n
        t_mask = offs_t < hi
        if PAGE_AHEAD:
            # the page ids are loop-carried, one tile ahead: the tile's copy then depends on no load
            # of its own iteration, and Triton's pipeliner double-buffers it (at 3 stages)
            page = page_next.to(tl.int64)
            offs_ahead = offs_t + BLOCK_N
            page_next = tl.load(table_row + (offs_ahead >> page_shift), mask=offs_ahead < hi, other=0)
        else:
            page = tl.load(table_row + (offs_t >> page_shift), mask=t_mask, other=0).to(tl.int64)
        slot = (offs_t & ((1 << page_shift) - 1)).to(tl.int64)
        k_row = page * stride_kp + slot * stride_kt + kvh64 * stride_kh
        ka = _tile(K, k_row, offs_a, t_mask[:, None] & a_mask[None, :], KV_KIND, PTX)
        qk = tl.dot(qa, tl.trans(ka))
        if BLOCK_B > 0:
            kb = _tile(K, k_row, offs_b, t_mask[:, None] & b_mask[None, :], KV_KIND, PTX)
            qk += tl.dot(qb, tl.trans(kb))
        qk = tl.where(t_mask[None, :], qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
        if LATENT:
            v = ka  # the value is the key's first D_V channels: the tile already loaded
        else:
            v_row = page * stride_vp + slot * stride_vt + kvh64 * stride_vh
            v = _tile(V, v_row, offs_v, t_mask[:, None] & v_mask[None, :], KV_KIND, PTX)
        acc = acc * alpha[:, None] + tl.dot(p.to(DT), v)

    # Workspace: PartO [batch, q_heads, num_splits, D_V], PartLse [batch, q_heads, num_splits]
    # (base-2, as decode's merge reads them). A NaN sum stays NaN so the merge returns NaN.
    slot_ids = (b * q_heads + heads).to(tl.int64) * num_splits + split
    inv_l = v_scale / tl.where(l_i > 0, l_i, 1.0)
    om = (h_mask & (hi > lo))[:, None] & v_mask[None, :]
    tl.store(PartO + slot_ids[:, None] * D_V + offs_v[None, :], acc * inv_l[:, None], mask=om)
    lse = tl.where(hi > lo, m_i + tl.log2(tl.where((l_i > 0) | (l_i != l_i), l_i, 1.0)), float("-inf"))
    tl.store(PartLse + slot_ids, lse, mask=h_mask)
