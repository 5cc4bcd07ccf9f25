"""Flash-decoding over a paged KV cache: one query token per request, split-K over the sequence.

`decode_split_kernel` runs on a grid (kv_heads * cdiv(group, BLOCK_H), batch, num_splits) that
depends on no sequence length, so one CUDA graph serves every step. Program (g, b, s) takes
BLOCK_H query heads of one KV group (K/V read once per group; QK^T is a [BLOCK_H, D] x [D, BLOCK_N]
tensor-core dot) over split s's contiguous chunk of request b's tokens. The chunk is derived here
from the runtime length, rounded up to BLOCK_N (common/schedule.split_tokens), and every program
starts from fresh accumulators and writes its own workspace slot: the two bugs review found in
LightLLM's fixed-grid refactor
(accumulators carried across the blocks a program visits, every block's partial stored to one
slot) cannot occur. A split with no tokens writes lse = -inf and no partial output. On sm90 it
is a programmatic dependent launch (PDL) of whatever kernel precedes it on the stream: its
programs are scheduled while that kernel drains and wait for it on the device before any read.

`decode_merge_kernel` combines the splits of one (request, head) by log-sum-exp, adds the
attention sink to the denominator, and writes zeros for a request of length 0 (no NaN: padded
graph rows have length 0). On sm90 it is launched as a programmatic dependent launch of the split
kernel and waits for it on the device (PDL).

Page size and quantization group size (both powers of two, passed as their log2 so that token ->
page and channel -> group are shifts: runtime integer division cost ~20 instructions a token and
took 1180 -> 885 instructions a tile and 238 -> 184 registers for bf16 on sm90), window, req_idx
presence: runtime ints. KV_KIND (constexpr)
selects how a tile is dequantized:
  0: fp16/bf16, the query's dtype.
  1: int8 * per-group scale.
  2: int4, two channels a byte (2i low nibble, 2i+1 high), stored as value + 7.
     Both are read as int16 words (int8: 2 channels, int4: 4) and split into strided channel
     slices, one dot each, with the query and output split alike. One scale a token (PER_TOKEN)
     and int8 groups of 64 (CHUNK_SCALES) dot exact codes and scale the scores and probabilities
     (`_attend_chunked`); other groups multiply each element by its scale (`_attend_int`).
     int8 with one scale a KV head and channel (CHANNEL_SCALES, scales [kv_heads, D]: the Iluvatar
     library's layout) runs the same exact code dots with K's scales folded into the query once
     and V's applied to the output once: nothing scales a tile.
  3, 4: fp8 e4m3 / e5m2, read as raw bytes and widened to fp16 with integer ops (Triton has no
     e4m3 type on sm80), with the per-head scale and the 2^8 exponent rebias of e4m3 folded into
     the score and output scales.
  5 (PER_TOKEN): int4_zp, vLLM's INT4_PER_TOKEN_HEAD codes: unsigned nibbles (2i low, 2i+1 high)
     and one fp32 word a token and KV head, the scale with the zero point in its 4 low mantissa
     bits; value = (nibble - zp) * scale. _attend_chunked's int4 loop with the zero point folded
     into the score and output corrections. The values are rotated: RHT binaries (vLLM's int4_rht)
     rotate q and their partial outputs themselves (_rht_query, _rht_output); the others read the
     codes as they are (the op's int4_zp).
  3 with PER_TOKEN: fp8 e4m3 with one fp32 scale a token and KV head (vLLM's FP8_PER_TOKEN_HEAD):
     K's scales multiply the scores, V's the probabilities, as the int8 per-token loop does.
SCORE_MOD binaries apply softcap and ALiBi (kernels/common/score_mod.py, runtime values) to the
natural-log scores. KV_ALIGN 4 binaries read K and V as 4-byte vectors whatever the level: their
rows start 4-byte aligned (vLLM's per-token-head cache: scales inline after each head's codes).
KV_ALIGN 8 (one scale a token, BLOCK_D == HEAD_DIM) is for exactly vLLM's record [K codes | K scale
| V codes | V scale], 2 * HEAD_DIM + 8 bytes, 8-byte aligned, K and V with the same strides: K is
read 8 bytes at a time and V, 4 bytes past an 8-byte boundary, 4 bytes at a time, both at K's row
offsets (one set of row addresses for the two tiles).
For kinds 1-4 the dots run in fp16 whatever the query dtype: codes and fp8 values are exact in
fp16, code * scale is rounded once, and a bf16 query converts exactly within fp16's range
(|q|, |k|, |v| < 65504).
Offsets are int64: page id * page stride can pass 2^31.
"""
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from aotc.kernels.common.dequant import (
    _INTERPRET, _expand, _fp8_bits_to_fp16, _i4x4_biased, _i4x4_codes16, _i4x4_dequant, _i8x2_biased, _i8x2_codes,
    _i8x2_dequant, _u4x4_codes16,
)
from aotc.kernels.common.schedule import split_program
from aotc.kernels.common.score_mod import _score_mod
from aotc.kernels.decode.spec import GROUP_RUN, MIN_QUANT_GROUP

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
# Channels a per-group scale run covers (_scales): the smallest group for the row read, GROUP_RUN
# for the in-place read of the "group" variant (spec.split_axes picks the variant by group size).
ROW_RUN = tl.constexpr(MIN_QUANT_GROUP)
IN_PLACE_RUN = tl.constexpr(GROUP_RUN)


@triton.jit
def _pages(table_row, offs_t, hi, page_shift):
    return tl.load(table_row + (offs_t >> page_shift), mask=offs_t < hi, other=0).to(tl.int64)


@triton.jit
def _pages_nc(table_row, offs_t, hi, page_shift, PTX: tl.constexpr):
    # _pages through inline PTX (ld.global.nc), which Triton's pipeliner does not see: it then
    # pipelines only the K/V copies, and at 3 stages waits for one tile's copies while the next
    # tile's are in flight (its own pipelining of the table load made every iteration wait for
    # all copies). Faster for int4 per group only; int8 and the per-token loops keep _pages
    # (BENCHMARKS.md, Kernel choices: table load).
    ptr = table_row + (offs_t >> page_shift)
    inside = offs_t < hi
    if _INTERPRET or not PTX:
        return tl.load(ptr, mask=inside, other=0).to(tl.int64)
    else:
        return tl.inline_asm_elementwise(
            """{
            .reg .pred p;
            setp.ne.b32 p, $2, 0;
            mov.b32 $0, 0;
            @p ld.global.nc.b32 $0, [$1];
            }""", "=r,l,r", [ptr, inside.to(tl.int32)], dtype=tl.int32, is_pure=True, pack=1).to(tl.int64)


@triton.jit
def _scales(S, page, offs_t, hi, page_shift, head, sp, st, sh, sg, quant_shift, VALID: tl.constexpr,
            ROW_SCALES: tl.constexpr, RUN: tl.constexpr):
    # fp16 scales of tokens offs_t, one per aligned run of RUN channels (a group holds whole runs:
    # RUN 8 for the row read, 32 in place): [len(offs_t), BLOCK_D // RUN], sg the run index, VALID
    # the runs inside head_dim.
    t_mask = offs_t < hi
    row = page * sp + (offs_t & ((1 << page_shift) - 1)).to(tl.int64) * st + head * sh
    if ROW_SCALES:
        # Groups of 8-16 channels (and 32 at head dims 64, 96): each token's row of scales
        # (HEAD_DIM >> quant_shift of them) is read whole, at contiguous columns, so that one load instruction covers a few tokens'
        # rows, then spread over the runs in registers (tl.gather). Reading each run's scale in
        # place made every load touch ~32 tokens' rows (BENCHMARKS.md, Kernel choices: scale rows).
        groups = (VALID * RUN) >> quant_shift
        raw = tl.load(S + row[:, None] + sg[None, :], mask=t_mask[:, None] & (sg < groups)[None, :], other=0.0)
        s = tl.gather(raw, tl.broadcast_to(((sg * RUN) >> quant_shift)[None, :], raw.shape), 1)
    else:
        # Groups of 32+ channels at head dims 128, 256: one scale a run of 32 read in place (4 a
        # token at head_dim 128), each once for groups of 32. Runs of 8 read each scale 8 times
        # (L1 served the repeats) at ~30 more loads and ~250 more address instructions a tile a
        # thread (BENCHMARKS.md, Kernel choices: scale runs).
        s = tl.load(S + row[:, None] + ((sg * RUN) >> quant_shift)[None, :],
                    mask=t_mask[:, None] & (sg < VALID)[None, :], other=0.0)
    return s.to(tl.float16)


@triton.jit
def _tile_ptrs(base, row, cols, KV_ALIGN: tl.constexpr):
    # A [rows, cols] tile of cache pointers; KV_ALIGN 4: rows start 4-byte aligned (the op checks the
    # cache's address and strides), else a GENERIC binary reads 1- or 2-byte elements. The hint
    # must sit on the op that makes the pointers (on a helper's parameter Triton drops it).
    ptrs = base + row[:, None] + cols[None, :]
    if KV_ALIGN == 4:
        ptrs = tl.multiple_of(ptrs, [4, 4])
    elif KV_ALIGN == 8:
        ptrs = tl.multiple_of(ptrs, [8, 8])
    return ptrs


@triton.jit
def _words(W16, page, offs_t, hi, page_shift, head, sp, st, sh, offs_c, c_mask, KV_ALIGN: tl.constexpr = 16):
    # One [len(offs_t), len(offs_c)] tile of int16 words of an int8/int4 cache (byte offsets halved:
    # the op checks that those caches' strides are even). Loaded in the tile's own iteration, which
    # Triton turns into cp.async; loading it a tile ahead into registers was slower (~60 more
    # registers; BENCHMARKS.md, Kernel choices: word tiles).
    slot = (offs_t & ((1 << page_shift) - 1)).to(tl.int64)
    row = (page * sp + slot * st + head * sh) >> 1
    return tl.load(_tile_ptrs(W16, row, offs_c, KV_ALIGN),
                   mask=(offs_t < hi)[:, None] & c_mask[None, :], other=0)


@triton.jit
def _tile_scales(KS, VS, page, offs_t, hi, page_shift, head, sg, quant_shift, ksp, kst, ksh, vsp, vst, vsh,
                 HEAD_DIM: tl.constexpr, ROW_SCALES: tl.constexpr, RUN: tl.constexpr):
    # K's and V's per-group scales for tokens offs_t: [len(offs_t), BLOCK_D // RUN] fp16 runs (_scales).
    return (_scales(KS, page, offs_t, hi, page_shift, head, ksp, kst, ksh, sg, quant_shift, HEAD_DIM // RUN,
                    ROW_SCALES, RUN),
            _scales(VS, page, offs_t, hi, page_shift, head, vsp, vst, vsh, sg, quant_shift, HEAD_DIM // RUN,
                    ROW_SCALES, RUN))


@triton.jit
def _softmax_step(qk, m_i, l_i):
    # Online softmax over one tile of base-2 scores qk [heads, tokens]: the tile's probabilities,
    # the factor that rescales what was accumulated before, and the new running max and sum.
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _scores(qk, qk_scale, t_mask, rel_k, softcap, slopes, alibi_mode, SCORE_MOD: tl.constexpr):
    # Base-2 scores of a tile from its dot products qk [heads, tokens] (qk_scale: sm_scale * log2(e),
    # a scalar or per token); SCORE_MOD: softcap and ALiBi on the natural-log scores first, the
    # query at relative position 0 (the last token), keys at rel_k.
    if SCORE_MOD:
        s = _score_mod(qk * (qk_scale / LOG2E), tl.zeros_like(slopes), rel_k, softcap, slopes[:, None], alibi_mode)
        qk = s * LOG2E
    else:
        qk = qk * qk_scale
    return tl.where(t_mask[None, :], qk, float("-inf"))


@triton.jit
def _token_scales(S_row, page, offs_t, hi, page_shift, sp, st):
    # One fp32 scale a token (fp8 per token): [len(offs_t)], 0 past hi.
    slot = (offs_t & ((1 << page_shift) - 1)).to(tl.int64)
    return tl.load(S_row + page * sp + slot * st, mask=offs_t < hi, other=0.0).to(tl.float32)


@triton.jit
def _load_tile(base, row, cols, mask, KV_KIND: tl.constexpr, PTX: tl.constexpr, KV_ALIGN: tl.constexpr = 16):
    # One [ROWS, COLS] tile of K or V at `base + row[:, None] + cols[None, :]`, as the dot reads it:
    # the query's dtype for fp16/bf16 caches, fp16 for fp8.
    x = tl.load(_tile_ptrs(base, row, cols, KV_ALIGN), mask=mask, other=0)
    if KV_KIND == 0:
        return x
    else:
        return _fp8_bits_to_fp16(x, KV_KIND, PTX)


@triton.jit(
    do_not_specialize=[
        "sm_scale", "window", "use_req_idx", "page_shift", "max_pages", "stride_table", "q_heads",
        "group", "quant_shift", "stride_ksp", "stride_kst", "stride_ksh", "stride_vsp", "stride_vst",
        "stride_vsh", "alibi_mode",
    ],
    do_not_specialize_on_alignment=["KS", "VS", "Table", "ReqIdx", "SeqLens", "Alibi"],
)
def decode_split_kernel(
    Q, K, V, KS, VS, Table, ReqIdx, SeqLens, PartO, PartLse, Alibi,
    sm_scale, window, use_req_idx, page_shift, max_pages, stride_table, q_heads, group, quant_shift,
    stride_qb, stride_qh,
    stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
    stride_ksp, stride_kst, stride_ksh, stride_vsp, stride_vst, stride_vsh,
    softcap, alibi_mode,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
    KV_KIND: tl.constexpr, PER_TOKEN: tl.constexpr, ROW_SCALES: tl.constexpr, CHUNK_SCALES: tl.constexpr,
    CHANNEL_SCALES: tl.constexpr, SCORE_MOD: tl.constexpr, KV_ALIGN: tl.constexpr, PDL: tl.constexpr,
    PTX: tl.constexpr, RHT: tl.constexpr,
):
    # RHT (int4_zp only, which takes no SCORE_MOD): Alibi holds the rotation's signs, [2, HEAD_DIM]
    # fp32 (the query's s / 2^e, the output's s / b; loader/ops/decode_rht.signs).
    # PDL (sm90+): launched as a programmatic dependent launch, this grid is scheduled while the
    # kernel before it on the stream drains; griddepcontrol.wait returns once that kernel has
    # completed and its writes are visible, and nothing is read before it; triggering the merge
    # early (launch_dependents at the start) was slower (BENCHMARKS.md, Kernel choices: PDL).
    if PDL and not _INTERPRET:
        gdc_wait()
    b, split, num_splits, kvh, h_mask, heads, lo, hi, seq_len, table_row = split_program(
        SeqLens, Table, ReqIdx, window, use_req_idx, max_pages, page_shift, stride_table, group, BLOCK_N, BLOCK_H)

    qk_scale = sm_scale * LOG2E
    kvh64 = kvh.to(tl.int64)
    q_rows = Q + b.to(tl.int64) * stride_qb + heads[:, None].to(tl.int64) * stride_qh
    slot_ids = (b * q_heads + heads).to(tl.int64) * num_splits + split
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    slopes = tl.zeros([BLOCK_H], dtype=tl.float32)
    if SCORE_MOD:
        slopes = tl.load(Alibi + heads, mask=h_mask & (alibi_mode != 0), other=0.0)
    last = seq_len - 1  # the query's position: ALiBi's key positions are relative to it
    if (KV_KIND == 1 or KV_KIND == 2 or KV_KIND == 5) and (PER_TOKEN or CHUNK_SCALES or CHANNEL_SCALES):
        m_i, l_i = _attend_chunked(
            Q, K, V, KS, VS, PartO, Alibi, q_rows, slot_ids, table_row, lo, hi, kvh64, h_mask, m_i, l_i, qk_scale,
            page_shift, quant_shift, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
            stride_ksp, stride_kst, stride_ksh, stride_vsp, stride_vst, stride_vsh, last, softcap, slopes, alibi_mode,
            HEAD_DIM, BLOCK_D, BLOCK_N, BLOCK_H, KV_KIND, PER_TOKEN, CHANNEL_SCALES, SCORE_MOD, KV_ALIGN, PTX, RHT)
    elif KV_KIND == 1 or KV_KIND == 2:
        m_i, l_i = _attend_int(
            Q, K, V, KS, VS, PartO, q_rows, slot_ids, table_row, lo, hi, kvh64, h_mask, m_i, l_i, qk_scale,
            page_shift, quant_shift, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
            stride_ksp, stride_kst, stride_ksh, stride_vsp, stride_vst, stride_vsh,
            HEAD_DIM, BLOCK_D, BLOCK_N, BLOCK_H, KV_KIND, ROW_SCALES, PTX)
    else:
        m_i, l_i = _attend_float(
            Q, K, V, KS, VS, PartO, q_rows, slot_ids, table_row, lo, hi, kvh, h_mask, m_i, l_i, qk_scale,
            page_shift, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
            stride_ksp, stride_kst, stride_ksh, stride_vsp, stride_vst, stride_vsh, last, softcap, slopes, alibi_mode,
            HEAD_DIM, BLOCK_D, BLOCK_N, BLOCK_H, KV_KIND, PER_TOKEN, SCORE_MOD, KV_ALIGN, PTX)
    # Workspace: PartO [batch, q_heads, num_splits, HEAD_DIM], PartLse [batch, q_heads, num_splits].
    # A NaN sum (a NaN or inf query or cache element) stays NaN here, so the merge returns NaN for
    # that head instead of taking the split for an empty one.
    lse = tl.where(hi > lo, m_i + tl.log2(tl.where((l_i > 0) | (l_i != l_i), l_i, 1.0)), float("-inf"))
    tl.store(PartLse + slot_ids, lse, mask=h_mask)


@triton.jit
def _attend_float(
    Q, K, V, KS, VS, PartO, q_rows, slot_ids, table_row, lo, hi, kvh, h_mask, m_i, l_i, qk_scale,
    page_shift, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
    stride_ksp, stride_kst, stride_ksh, stride_vsp, stride_vst, stride_vsh, last, softcap, slopes, alibi_mode,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
    KV_KIND: tl.constexpr, PER_TOKEN: tl.constexpr, SCORE_MOD: tl.constexpr, KV_ALIGN: tl.constexpr,
    PTX: tl.constexpr,
):
    # fp16/bf16 (in the query's dtype) and fp8 (widened to fp16) caches: one dot each for QK and PV.
    # fp8 PER_TOKEN: each token's K scale joins the scores and its V scale the probabilities.
    DT: tl.constexpr = Q.dtype.element_ty if KV_KIND == 0 else tl.float16
    v_scale = 1.0
    if PER_TOKEN:
        rebias = 256.0 if KV_KIND == 3 else 1.0  # e4m3 bytes were widened to value * 2^-8
        qk_scale = qk_scale * rebias
        v_scale = rebias
    elif KV_KIND >= 3:
        # Per-head scale (stride 0 for a scalar); e4m3 bytes were widened to value * 2^-8.
        rebias = 256.0 if KV_KIND == 3 else 1.0
        qk_scale = qk_scale * tl.load(KS + kvh * stride_ksh).to(tl.float32) * rebias
        v_scale = tl.load(VS + kvh * stride_vsh).to(tl.float32) * rebias
    offs_c = tl.arange(0, BLOCK_D)
    c_mask = offs_c < HEAD_DIM
    qm = h_mask[:, None] & c_mask[None, :]
    q = tl.load(q_rows + offs_c[None, :], mask=qm, other=0.0).to(DT)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    kvh64 = kvh.to(tl.int64)
    for t0 in range(lo, hi, BLOCK_N):
        offs_t = t0 + tl.arange(0, BLOCK_N)
        t_mask = offs_t < hi
        page = _pages(table_row, offs_t, hi, page_shift)
        slot = (offs_t & ((1 << page_shift) - 1)).to(tl.int64)
        k_row = page * stride_kp + slot * stride_kt + kvh64 * stride_kh
        if KV_ALIGN == 8:
            v_row = k_row  # vLLM's record: V's strides are K's (the op checks)
        else:
            v_row = page * stride_vp + slot * stride_vt + kvh64 * stride_vh
        mask = t_mask[:, None] & c_mask[None, :]
        k = _load_tile(K, k_row, offs_c, mask, KV_KIND, PTX, KV_ALIGN)
        if PER_TOKEN:  # scales read here: a tile-ahead prefetch lost (BENCHMARKS.md, vLLM's per-token-head caches)
            ks = _token_scales(KS + kvh64 * stride_ksh, page, offs_t, hi, page_shift, stride_ksp, stride_kst)
            vs = _token_scales(VS + kvh64 * stride_vsh, page, offs_t, hi, page_shift, stride_vsp, stride_vst)
            qk = _scores(tl.dot(q, tl.trans(k)), (qk_scale * ks)[None, :], t_mask, offs_t - last, softcap, slopes,
                         alibi_mode, SCORE_MOD)
        else:
            qk = _scores(tl.dot(q, tl.trans(k)), qk_scale, t_mask, offs_t - last, softcap, slopes, alibi_mode,
                         SCORE_MOD)
        p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i)
        if PER_TOKEN:
            p = p * vs[None, :]
        # KV_ALIGN 8: V rows start 4 bytes past an 8-byte boundary
        v = _load_tile(V, v_row, offs_c, mask, KV_KIND, PTX, 4 if KV_ALIGN == 8 else KV_ALIGN)
        acc = acc * alpha[:, None] + tl.dot(p.to(DT), v)
    inv_l = v_scale / tl.where(l_i > 0, l_i, 1.0)
    om = (h_mask & (hi > lo))[:, None] & c_mask[None, :]
    tl.store(PartO + slot_ids[:, None] * HEAD_DIM + offs_c[None, :], acc * inv_l[:, None], mask=om)
    return m_i, l_i


# int16 words a chunk of CHUNK_SCALES: 64 int8 channels. 16-word chunks (groups of 32) gave the
# PV dots [16, 16] outputs, for which Triton lays all 4 warps along the 16 rows: 4096 instructions
# and spills (sm90), against 1768 at 32 words.
CHUNK_WORDS = tl.constexpr(32)


@triton.jit
def _chunk_scales(S_row, page, offs_t, hi, page_shift, sp, st, quant_shift, CHUNKS: tl.constexpr,
                  CHUNK_CH: tl.constexpr, DT: tl.constexpr):
    # One scale a token for each chunk of CHUNK_CH channels (a chunk lies inside one group): a
    # tuple of CHUNKS [len(offs_t)] vectors, as DT. One scale a token: CHUNKS == 1, column 0.
    slot = (offs_t & ((1 << page_shift) - 1)).to(tl.int64)
    row = S_row + page * sp + slot * st
    t_mask = offs_t < hi
    s = ()
    for c in tl.static_range(CHUNKS):
        s = s + (tl.load(row + ((c * CHUNK_CH) >> quant_shift), mask=t_mask, other=0.0).to(DT),)
    return s


@triton.jit
def _zp_scales(S_row, page, offs_t, hi, page_shift, sp, st):
    # int4_zp's scale words of tokens offs_t: (the scale, its 4 low mantissa bits cleared; the zero
    # point those bits hold), fp32 [len(offs_t)], 0 past hi.
    slot = (offs_t & ((1 << page_shift) - 1)).to(tl.int64)
    w = tl.load(S_row.to(tl.pointer_type(tl.int32)) + page * sp + slot * st, mask=offs_t < hi, other=0)
    return (w & -16).to(tl.float32, bitcast=True), (w & 15).to(tl.float32)


@triton.jit
def _code_dots(q, x, INT4: tl.constexpr, PTX: tl.constexpr):
    # Scores of one chunk over biased codes (see k_bias): q a tuple of the chunk's PARTS query slices.
    if INT4:
        k0, k1, k2, k3 = _i4x4_biased(x, PTX)
        return tl.dot(q[0], tl.trans(k0), tl.dot(q[2], tl.trans(k2))) \
            + tl.dot(q[1], tl.trans(k1), tl.dot(q[3], tl.trans(k3))) * 0.0625
    else:
        k0, k1 = _i8x2_biased(x, PTX)
        return tl.dot(q[0], tl.trans(k0), tl.dot(q[1], tl.trans(k1)))


@triton.jit
def _hadamard(N: tl.constexpr, DT: tl.constexpr):
    # H_N [N, N] as DT (Sylvester, unnormalized): entry (i, j) = (-1)^popcount(i & j), N <= 32.
    i = tl.arange(0, N)
    x = i[:, None] & i[None, :]
    x = x ^ (x >> 4)
    x = x ^ (x >> 2)
    x = x ^ (x >> 1)
    return (1 - 2 * (x & 1)).to(DT)


@triton.jit
def _dot_h(x, h):
    # x [M, N] fp32 times h [N, N] bf16 (entries +-1, exact) near fp32's precision: x as a hi + lo
    # pair of bf16 (16 of fp32's 24 mantissa bits, fp32's range), two exact-product dots.
    hi = x.to(h.dtype)
    lo = (x - hi.to(tl.float32)).to(h.dtype)
    return tl.dot(lo, h, tl.dot(hi, h))


@triton.jit
def _butterfly(a0, a1, a2, a3):
    # The 4-point Hadamard over the parts: b_p = sum_r (-1)^popcount(r & p) a_r.
    s01, d01, s23, d23 = a0 + a1, a0 - a1, a2 + a3, a2 - a3
    return s01 + s23, d01 + d23, s01 - s23, d01 - d23


@triton.jit
def _rht_query(q_cols, qm, Rot, cols, CW: tl.constexpr):
    # vLLM's rotation R = diag(s) H_D (kernels/common/int4_rht.py, one block at head dims 64 and 128)
    # of the query, q' = q R / 2^e, as the int4 parts (channels 4w + p) the code dots take, fp16.
    # H_D = H_CW (x) H_4 over channels 4w + p (Sylvester), so part p of q' is (the 4-point Hadamard
    # of q s over each word's channels, part p) @ H_CW: four [BLOCK_H, CW] x [CW, CW] dots. That
    # butterfly rounded to fp16 and q' rounded to fp16: the dots read q' in fp16 (a bf16 q within
    # fp16's range, as for the other int4 loops), so one more fp16 rounding, not a hi/lo pair.
    a = ()
    for r in tl.static_range(4):
        s = tl.load(Rot + 4 * cols + r)  # s / 2^e
        a = a + (tl.load(q_cols + r, mask=qm, other=0.0).to(tl.float32) * s[None, :],)
    u0, u1, u2, u3 = _butterfly(a[0], a[1], a[2], a[3])
    h = _hadamard(CW, tl.float16)
    return (_dot_h(u0, h).to(tl.float16), _dot_h(u1, h).to(tl.float16), _dot_h(u2, h).to(tl.float16),
            _dot_h(u3, h).to(tl.float16))


@triton.jit
def _rht_output(o, Rot, cols, CW: tl.constexpr):
    # The partial output's inverse rotation, out = o' R^T / b = s * (o' H_D) / b, part by part as
    # _rht_query (H_D symmetric); Rot: s / b. fp32 in and out.
    v0, v1, v2, v3 = _butterfly(o[0], o[1], o[2], o[3])
    h = _hadamard(CW, tl.bfloat16)
    return (_dot_h(v0, h) * tl.load(Rot + 4 * cols)[None, :], _dot_h(v1, h) * tl.load(Rot + 4 * cols + 1)[None, :],
            _dot_h(v2, h) * tl.load(Rot + 4 * cols + 2)[None, :], _dot_h(v3, h) * tl.load(Rot + 4 * cols + 3)[None, :])


@triton.jit
def _attend_chunked(
    Q, K, V, KS, VS, PartO, Rot, q_rows, slot_ids, table_row, lo, hi, kvh64, h_mask, m_i, l_i, qk_scale,
    page_shift, quant_shift, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
    stride_ksp, stride_kst, stride_ksh, stride_vsp, stride_vst, stride_vsh, last, softcap, slopes, alibi_mode,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
    KV_KIND: tl.constexpr, PER_TOKEN: tl.constexpr, CHANNEL: tl.constexpr, SCORE_MOD: tl.constexpr,
    KV_ALIGN: tl.constexpr, PTX: tl.constexpr, RHT: tl.constexpr,
):
    # int8/int4 caches whose scale is constant over chunks of words: one scale a token (PER_TOKEN:
    # one chunk, the whole head, int8 or int4), or int8 groups of 64+ channels (CHUNK_WORDS words a
    # chunk). Each chunk's scores are exact dots over biased codes (words split into PARTS strided
    # channel slices, as in _attend_int), scaled after the dot by the chunk's K scale; V's scale
    # joins the probabilities of each chunk's dot. No scale is multiplied into, or expanded over, a
    # tile of the cache.
    # PER_TOKEN dots over biased codes (_i8x2_biased: code + 1152; _i4x4_biased: code + 1031, and
    # 16 code + 1136 in parts 1, 3, which are scaled by 1/16) give the code dot plus k_bias: each
    # head's sum of q times the offset, subtracted from the fp32 scores. Exact products; the
    # subtraction costs ~2^-17 of the score's magnitude, against the f16x2 subtraction an element
    # it saves (int4: 11 -> 5 instructions a register of eight channels). A constexpr loop, not a
    # runtime branch beside the per-element one: with both loops in one binary the per-group loop
    # lost 7 points of copy bandwidth (BENCHMARKS.md, Kernel choices: constexpr loops).
    # ZP (KV_KIND 5, int4_zp, PER_TOKEN): unsigned nibbles n and a zero point zp a token in the fp32
    # scale word (_zp_scales): value = (n - zp) * scale. The biased dots take offsets 1024 and 64
    # (no +7), and q's sum times each token's zp joins k_bias; V's dots read n exactly
    # (_u4x4_codes16) and the probabilities' sum times zp (zacc) is subtracted from the output.
    ZP: tl.constexpr = KV_KIND == 5
    INT4: tl.constexpr = KV_KIND == 2 or ZP
    PARTS: tl.constexpr = 4 if INT4 else 2
    WORDS: tl.constexpr = BLOCK_D // PARTS
    # CHANNEL (int8, scales [kv_heads, D] at KS/VS + kvh * stride_ksh, channel stride 1): q times
    # K's channel scales is the query of exact code dots (K = codes * scale per channel, so q.K =
    # (q * scale).codes), and V's channel scales multiply the output once; no token scale is read.
    # One chunk of the whole head up to head_dim 128 (as PER_TOKEN), CHUNK_WORDS chunks above.
    CW: tl.constexpr = WORDS if PER_TOKEN or (CHANNEL and BLOCK_D <= 128) else CHUNK_WORDS
    CHUNKS: tl.constexpr = WORDS // CW
    CHUNK_CH: tl.constexpr = CW * PARTS
    offs_w = tl.arange(0, CW)
    K16 = K.to(tl.pointer_type(tl.int16))
    V16 = V.to(tl.pointer_type(tl.int16))
    qs = ()
    k_bias = ()
    acc = ()
    for c in tl.static_range(CHUNKS):
        cols = c * CW + offs_w
        qm = h_mask[:, None] & (cols < HEAD_DIM // PARTS)[None, :]
        q_cols = q_rows + PARTS * cols[None, :]
        q0 = tl.load(q_cols, mask=qm, other=0.0).to(tl.float16)
        q1 = tl.load(q_cols + 1, mask=qm, other=0.0).to(tl.float16)
        if CHANNEL:
            kc = KS + kvh64 * stride_ksh + PARTS * cols
            cm = cols < HEAD_DIM // PARTS
            q0 = (q0.to(tl.float32) * tl.load(kc, mask=cm, other=0.0)[None, :]).to(tl.float16)
            q1 = (q1.to(tl.float32) * tl.load(kc + 1, mask=cm, other=0.0)[None, :]).to(tl.float16)
        if INT4:
            q2 = tl.load(q_cols + 2, mask=qm, other=0.0).to(tl.float16)
            q3 = tl.load(q_cols + 3, mask=qm, other=0.0).to(tl.float16)
            if RHT:  # the query's parts again, rotated: q' = q R / 2^e (one chunk: the whole head)
                q0, q1, q2, q3 = _rht_query(q_cols, qm, Rot, cols, CW)
            qs = qs + ((q0, q1, q2, q3),)
            s02 = tl.sum(q0.to(tl.float32), 1) + tl.sum(q2.to(tl.float32), 1)
            s13 = tl.sum(q1.to(tl.float32), 1) + tl.sum(q3.to(tl.float32), 1)
            if ZP:
                k_bias = k_bias + (1024.0 * s02 + 64.0 * s13,)
                q_sum = s02 + s13
            else:
                k_bias = k_bias + (1031.0 * s02 + 71.0 * s13,)
        else:
            qs = qs + ((q0, q1),)
            k_bias = k_bias + (1152.0 * (tl.sum(q0.to(tl.float32), 1) + tl.sum(q1.to(tl.float32), 1)),)
        for i in tl.static_range(PARTS):
            acc = acc + (tl.zeros([BLOCK_H, CW], dtype=tl.float32),)
    zacc = tl.zeros([BLOCK_H], dtype=tl.float32)  # ZP: the probabilities' sum times V's zero points

    ks_row = KS + kvh64 * stride_ksh
    vs_row = VS + kvh64 * stride_vsh
    if not CHANNEL:
        offs_n = lo + tl.arange(0, BLOCK_N)
        page_n = _pages(table_row, offs_n, hi, page_shift)
        if ZP:
            ks, kz = _zp_scales(ks_row, page_n, offs_n, hi, page_shift, stride_ksp, stride_kst)
            vs, vz = _zp_scales(vs_row, page_n, offs_n, hi, page_shift, stride_vsp, stride_vst)
        else:
            ks = _chunk_scales(ks_row, page_n, offs_n, hi, page_shift, stride_ksp, stride_kst, quant_shift, CHUNKS,
                               CHUNK_CH, tl.float32)
            vs = _chunk_scales(vs_row, page_n, offs_n, hi, page_shift, stride_vsp, stride_vst, quant_shift, CHUNKS,
                               CHUNK_CH, tl.float16)
        page_n = _pages(table_row, offs_n + BLOCK_N, hi, page_shift)
    for t0 in range(lo, hi, BLOCK_N):
        offs_t = t0 + tl.arange(0, BLOCK_N)
        t_mask = offs_t < hi
        if not CHANNEL:
            offs_n = offs_t + BLOCK_N
            if ZP:
                ks_next, kz_next = _zp_scales(ks_row, page_n, offs_n, hi, page_shift, stride_ksp, stride_kst)
                vs_next, vz_next = _zp_scales(vs_row, page_n, offs_n, hi, page_shift, stride_vsp, stride_vst)
            else:
                ks_next = _chunk_scales(ks_row, page_n, offs_n, hi, page_shift, stride_ksp, stride_kst, quant_shift,
                                        CHUNKS, CHUNK_CH, tl.float32)
                vs_next = _chunk_scales(vs_row, page_n, offs_n, hi, page_shift, stride_vsp, stride_vst, quant_shift,
                                        CHUNKS, CHUNK_CH, tl.float16)
            page_n = _pages(table_row, offs_n + BLOCK_N, hi, page_shift)
        page = _pages(table_row, offs_t, hi, page_shift)
        for c in tl.static_range(CHUNKS):
            cols = c * CW + offs_w
            kx = _words(K16, page, offs_t, hi, page_shift, kvh64, stride_kp, stride_kt, stride_kh, cols,
                        cols < HEAD_DIM // PARTS, KV_ALIGN)
            if CHANNEL:
                term = (_code_dots(qs[c], kx, INT4, PTX) - k_bias[c][:, None]) * qk_scale
            elif ZP:
                term = (_code_dots(qs[c], kx, INT4, PTX) - k_bias[c][:, None] - q_sum[:, None] * kz[None, :]) \
                    * (ks * qk_scale)[None, :]
            else:
                term = (_code_dots(qs[c], kx, INT4, PTX) - k_bias[c][:, None]) * (ks[c] * qk_scale)[None, :]
            if c == 0:
                qk = term
            else:
                qk += term
        if SCORE_MOD:
            qk = _scores(qk, 1.0, t_mask, offs_t - last, softcap, slopes, alibi_mode, SCORE_MOD)
        else:
            qk = tl.where(t_mask[None, :], qk, float("-inf"))
        p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i)
        new_acc = ()
        for c in tl.static_range(CHUNKS):
            cols = c * CW + offs_w
            if KV_ALIGN == 8:
                # vLLM's record: V's strides are K's (the op checks), so both tiles share K's row offsets;
                # V's rows start 4 bytes past an 8-byte boundary
                vx = _words(V16, page, offs_t, hi, page_shift, kvh64, stride_kp, stride_kt, stride_kh, cols,
                            cols < HEAD_DIM // PARTS, 4)
            else:
                vx = _words(V16, page, offs_t, hi, page_shift, kvh64, stride_vp, stride_vt, stride_vh, cols,
                            cols < HEAD_DIM // PARTS, KV_ALIGN)
            if CHANNEL:
                pd = p.to(tl.float16)
            elif ZP:
                pd = (p * vs[None, :]).to(tl.float16)
                zacc = zacc * alpha + tl.sum(pd.to(tl.float32) * vz[None, :], 1)
            else:
                pd = (p * vs[c].to(tl.float32)[None, :]).to(tl.float16)
            if ZP:
                v0, v1, v2, v3 = _u4x4_codes16(vx, PTX)
            elif INT4:
                v0, v1, v2, v3 = _i4x4_codes16(vx, PTX)
            if INT4:
                # parts 2, 3 first: the order the int4 per-token binaries were timed in
                a2 = acc[PARTS * c + 2] * alpha[:, None] + tl.dot(pd, v2)
                a3 = acc[PARTS * c + 3] * alpha[:, None] + tl.dot(pd, v3)
                new_acc = new_acc + (acc[PARTS * c] * alpha[:, None] + tl.dot(pd, v0),
                                     acc[PARTS * c + 1] * alpha[:, None] + tl.dot(pd, v1), a2, a3)
            else:
                v0, v1 = _i8x2_codes(vx, PTX)
                new_acc = new_acc + (acc[PARTS * c] * alpha[:, None] + tl.dot(pd, v0),
                                     acc[PARTS * c + 1] * alpha[:, None] + tl.dot(pd, v1))
        acc = new_acc
        if not CHANNEL:
            ks = ks_next
            vs = vs_next
            if ZP:
                kz = kz_next
                vz = vz_next

    inv_l = 1.0 / tl.where(l_i > 0, l_i, 1.0)
    for c in tl.static_range(CHUNKS):
        cols = c * CW + offs_w
        om = (h_mask & (hi > lo))[:, None] & (cols < HEAD_DIM // PARTS)[None, :]
        o_cols = PartO + slot_ids[:, None] * HEAD_DIM + PARTS * cols[None, :]
        parts = ()
        for i in tl.static_range(PARTS):
            # int4 parts 1, 3 summed 16 x code (_i4x4_codes16)
            scale = inv_l * 0.0625 if INT4 and i % 2 == 1 else inv_l
            o = acc[PARTS * c + i] * scale[:, None]
            if ZP:
                o = o - (zacc * inv_l)[:, None]
            if CHANNEL:
                vc = tl.load(vs_row + PARTS * cols + i, mask=cols < HEAD_DIM // PARTS, other=0.0)
                o = o * vc[None, :]
            parts = parts + (o,)
        if RHT:
            # Each split's partial rotated back before it is stored, not in the merge: the rotation is
            # linear (the merge's weighted sum is unchanged) and mixes every channel of the head, which
            # the merge's 32-channel programs do not hold.
            parts = _rht_output(parts, Rot + HEAD_DIM, cols, CW)
        for i in tl.static_range(PARTS):
            tl.store(o_cols + i, parts[i], mask=om)
    return m_i, l_i


@triton.jit
def _attend_int(
    Q, K, V, KS, VS, PartO, q_rows, slot_ids, table_row, lo, hi, kvh64, h_mask, m_i, l_i, qk_scale,
    page_shift, quant_shift, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
    stride_ksp, stride_kst, stride_ksh, stride_vsp, stride_vst, stride_vsh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
    KV_KIND: tl.constexpr, ROW_SCALES: tl.constexpr, PTX: tl.constexpr,
):
    # int8/int4 caches with per-group scales multiplied into each dequantized element ("group",
    # "small_group"), read as int16 words: PARTS channels a word (int8: 2j, 2j+1; int4: 4j..4j+3).
    # Part i of every word is one fp16 [BLOCK_N, BLOCK_D / PARTS] tile, so QK and PV are PARTS dots
    # over strided channel slices (q and the output are split alike). A 16-bit element lets the
    # dot read V with ldmatrix.trans; an 8-bit one is transposed a byte at a time (128 LDS.U8 and
    # ~200 PRMT a thread a tile), which held int8 at 48% of copy bandwidth (H100, batch 32 x 4K;
    # 66% this way).
    INT4: tl.constexpr = KV_KIND == 2
    PARTS: tl.constexpr = 4 if INT4 else 2
    DCOLS: tl.constexpr = BLOCK_D // PARTS
    offs_c = tl.arange(0, DCOLS)
    c_mask = offs_c < HEAD_DIM // PARTS
    K16 = K.to(tl.pointer_type(tl.int16))
    V16 = V.to(tl.pointer_type(tl.int16))
    qm = h_mask[:, None] & c_mask[None, :]
    q_cols = q_rows + PARTS * offs_c[None, :]
    q0 = tl.load(q_cols, mask=qm, other=0.0).to(tl.float16)
    q1 = tl.load(q_cols + 1, mask=qm, other=0.0).to(tl.float16)
    acc0 = tl.zeros([BLOCK_H, DCOLS], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_H, DCOLS], dtype=tl.float32)
    if INT4:
        q2 = tl.load(q_cols + 2, mask=qm, other=0.0).to(tl.float16)
        q3 = tl.load(q_cols + 3, mask=qm, other=0.0).to(tl.float16)
        acc2 = tl.zeros([BLOCK_H, DCOLS], dtype=tl.float32)
        acc3 = tl.zeros([BLOCK_H, DCOLS], dtype=tl.float32)

    # Scales are 2-byte gathers, which Triton's pipeliner leaves synchronous: each tile would wait
    # a full memory latency for them. Prefetch them by hand one tile ahead (and the table entries
    # they need two tiles ahead), so that latency hides behind a tile's work (H100, int8 batch 32 x
    # 16K: 606 -> 498 us).
    RUN: tl.constexpr = ROW_RUN if ROW_SCALES else IN_PLACE_RUN
    sg = tl.arange(0, BLOCK_D // RUN)
    offs_n = lo + tl.arange(0, BLOCK_N)
    page_n = _pages(table_row, offs_n, hi, page_shift)
    ks, vs = _tile_scales(KS, VS, page_n, offs_n, hi, page_shift, kvh64, sg, quant_shift,
                          stride_ksp, stride_kst, stride_ksh, stride_vsp, stride_vst, stride_vsh,
                          HEAD_DIM, ROW_SCALES, RUN)
    page_n = _pages(table_row, offs_n + BLOCK_N, hi, page_shift)
    for t0 in range(lo, hi, BLOCK_N):
        offs_t = t0 + tl.arange(0, BLOCK_N)
        t_mask = offs_t < hi
        offs_n = offs_t + BLOCK_N
        ks_next, vs_next = _tile_scales(KS, VS, page_n, offs_n, hi, page_shift, kvh64, sg, quant_shift,
                                        stride_ksp, stride_kst, stride_ksh, stride_vsp, stride_vst, stride_vsh,
                                        HEAD_DIM, ROW_SCALES, RUN)
        page_n = _pages(table_row, offs_n + BLOCK_N, hi, page_shift)
        # This tile's page ids again, though page_n held them last iteration: with K/V addresses from
        # a loop-carried load, Triton's pipeliner stops turning the K/V loads into cp.async.
        if INT4:
            page = _pages_nc(table_row, offs_t, hi, page_shift, PTX)
        else:
            page = _pages(table_row, offs_t, hi, page_shift)
        kx = _words(K16, page, offs_t, hi, page_shift, kvh64, stride_kp, stride_kt, stride_kh, offs_c, c_mask)
        if INT4:
            k0, k1, k2, k3 = _i4x4_dequant(kx, _expand(ks, BLOCK_N, DCOLS), PTX)
            qk = tl.dot(q0, tl.trans(k0)) + tl.dot(q1, tl.trans(k1)) + tl.dot(q2, tl.trans(k2)) \
                + tl.dot(q3, tl.trans(k3))
        else:
            k0, k1 = _i8x2_dequant(kx, _expand(ks, BLOCK_N, DCOLS), PTX)
            qk = tl.dot(q0, tl.trans(k0)) + tl.dot(q1, tl.trans(k1))
        qk = tl.where(t_mask[None, :], qk * qk_scale, float("-inf"))
        p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i)
        vx = _words(V16, page, offs_t, hi, page_shift, kvh64, stride_vp, stride_vt, stride_vh, offs_c, c_mask)
        pd = p.to(tl.float16)
        vse = _expand(vs, BLOCK_N, DCOLS)
        if INT4:
            v0, v1, v2, v3 = _i4x4_dequant(vx, vse, PTX)
            acc2 = acc2 * alpha[:, None] + tl.dot(pd, v2)
            acc3 = acc3 * alpha[:, None] + tl.dot(pd, v3)
        else:
            v0, v1 = _i8x2_dequant(vx, vse, PTX)
        acc0 = acc0 * alpha[:, None] + tl.dot(pd, v0)
        acc1 = acc1 * alpha[:, None] + tl.dot(pd, v1)
        ks = ks_next
        vs = vs_next

    inv_l = 1.0 / tl.where(l_i > 0, l_i, 1.0)
    om = (h_mask & (hi > lo))[:, None] & c_mask[None, :]
    o_cols = PartO + slot_ids[:, None] * HEAD_DIM + PARTS * offs_c[None, :]
    tl.store(o_cols, acc0 * inv_l[:, None], mask=om)
    tl.store(o_cols + 1, acc1 * inv_l[:, None], mask=om)
    if INT4:
        tl.store(o_cols + 2, acc2 * inv_l[:, None], mask=om)
        tl.store(o_cols + 3, acc3 * inv_l[:, None], mask=om)
    return m_i, l_i


@triton.jit(
    do_not_specialize=["use_sinks", "write_lse", "q_heads", "num_splits", "stride_lse"],
    do_not_specialize_on_alignment=["Sinks", "Lse"],
)
def decode_merge_kernel(
    PartO, PartLse, Sinks, Out, Lse,
    use_sinks, write_lse, q_heads, num_splits,
    stride_ob, stride_oh, stride_lse,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, LOOP: tl.constexpr, PDL: tl.constexpr,
):
    # PDL (sm90+): launched as a programmatic dependent launch, this grid may start while the
    # split kernel finishes; griddepcontrol.wait returns once the split grid has completed and its
    # writes are visible. Nothing is read before it (BENCHMARKS.md, Kernel choices: PDL).
    # Program (b, h, c) merges channels [c * BLOCK_D, (c + 1) * BLOCK_D) of (request b, head h).
    # LOOP 0: all num_splits (<= BLOCK_S) in one [BLOCK_S, BLOCK_D] tile (from 17 splits, channels
    # spread over programs as the loop's are). LOOP 1: any count, BLOCK_S
    # splits at a time (the largest log-sum-exp first, then the weighted sum), reading only the
    # partials of splits that attended tokens.
    if PDL and not _INTERPRET:
        gdc_wait()
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    slot0 = (b * q_heads + h).to(tl.int64) * num_splits
    if LOOP:
        m = tl.full([], float("-inf"), tl.float32)
        for s0 in range(0, num_splits, BLOCK_S):
            lse = tl.load(PartLse + slot0 + s0 + offs_s, mask=s0 + offs_s < num_splits, other=float("-inf"))
            m = tl.maximum(m, tl.max(lse, 0))
    else:
        lse = tl.load(PartLse + slot0 + offs_s, mask=offs_s < num_splits, other=float("-inf"))
        m = tl.max(lse, 0)
    sink = tl.full([], float("-inf"), tl.float32)
    if use_sinks != 0:
        sink = tl.load(Sinks + h).to(tl.float32) * LOG2E
        m = tl.maximum(m, sink)
    m = tl.where(m == float("-inf"), 0.0, m)  # length 0, no sink: every weight below is 0
    if LOOP:
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        denom = tl.exp2(sink - m)
        for s0 in range(0, num_splits, BLOCK_S):
            in_range = s0 + offs_s < num_splits
            lse = tl.load(PartLse + slot0 + s0 + offs_s, mask=in_range, other=float("-inf"))
            w = tl.exp2(lse - m)
            denom += tl.sum(w, 0)
            # NaN (a NaN split) passes `lse != -inf`: its partial is read and the NaN kept.
            o = tl.load(PartO + (slot0 + s0 + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
                        mask=(in_range & (lse != float("-inf")))[:, None] & d_mask[None, :], other=0.0)
            acc += tl.sum(o * w[:, None], 0)
    elif BLOCK_S > 64:
        # The wide tile (spec.MERGE_WIDE_SPLITS): many splits come with short requests, most of
        # them empty; only the partials of splits that attended tokens are read (as the loop does).
        w = tl.exp2(lse - m)
        denom = tl.sum(w, 0) + tl.exp2(sink - m)
        o = tl.load(PartO + (slot0 + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=((offs_s < num_splits) & (lse != float("-inf")))[:, None] & d_mask[None, :], other=0.0)
        acc = tl.sum(o * w[:, None], 0)
    else:
        w = tl.exp2(lse - m)
        denom = tl.sum(w, 0) + tl.exp2(sink - m)
        # Empty splits wrote no partial (their slot may hold NaN from an earlier call): selected away,
        # not masked, so this load does not wait for the log-sum-exps.
        valid = lse > float("-inf")
        o = tl.load(PartO + (slot0 + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=(offs_s < num_splits)[:, None] & d_mask[None, :], other=0.0)
        o = tl.where(valid[:, None], o, 0.0)
        acc = tl.sum(o * w[:, None], 0)
    out = acc / tl.where(denom > 0, denom, 1.0)
    out_ptr = Out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + offs_d
    tl.store(out_ptr, out.to(Out.dtype.element_ty), mask=d_mask)
    if write_lse != 0 and tl.program_id(2) == 0:
        # The natural log of the denominator `out` was divided by: the scaled scores' log-sum-exp
        # over the attended tokens (the window's, when one is set) plus the sink, so that (out, lse)
        # merges with another attention state. -inf where nothing was attended (out is zeros).
        # Split log-sum-exps are base 2 (scores were scaled by log2(e)): ln(x) = log2(x) * ln(2).
        total = tl.where(denom > 0, (m + tl.log2(tl.where(denom > 0, denom, 1.0))) * LN2,
                         tl.where(denom != denom, denom, float("-inf")))  # NaN in, NaN out
        tl.store(Lse + b.to(tl.int64) * stride_lse + h, total)
