"""Flash-decoding over a paged KV cache: one query token per request, split-K over the sequence.

`decode_split_kernel` runs on a grid (batch, kv_heads * cdiv(group, BLOCK_H), num_splits) that
depends on no sequence length, so one CUDA graph serves every step. Program (b, g, s) takes
BLOCK_H query heads of one KV group (K/V read once per group; QK^T is a [BLOCK_H, D] x [D, BLOCK_N]
tensor-core dot) over split s's contiguous chunk of request b's tokens. The chunk is derived here
from the runtime length, rounded up to BLOCK_N, and every program starts from fresh accumulators
and writes its own workspace slot: the two bugs review found in LightLLM's fixed-grid refactor
(accumulators carried across the blocks a program visits, every block's partial stored to one
slot) cannot occur. A split with no tokens writes lse = -inf and no partial output.

`decode_merge_kernel` combines the splits of one (request, head) by log-sum-exp, adds the
attention sink to the denominator, and writes zeros for a request of length 0 (no NaN: padded
graph rows have length 0).

Page size, window, req_idx presence, quantization group size: runtime ints. KV_KIND (constexpr)
selects how a tile is dequantized:
  0: fp16/bf16, the query's dtype.
  1: int8 * per-group scale.
  2: int4, two channels a byte (2i low nibble, 2i+1 high), stored as value + 7. Query channels
     are split even/odd so QK = q_even.lo^T + q_odd.hi^T with no interleaving in registers.
  3, 4: fp8 e4m3 / e5m2, read as raw bytes and widened to fp16 with integer ops (Triton has no
     e4m3 type on sm80), with the per-head scale and the 2^8 exponent rebias of e4m3 folded into
     the score and output scales. The dots run in fp16 whatever the query dtype: every fp8 value
     is exact in fp16, and a bf16 query is exact in fp16 within fp16's range.
Offsets are int64: page id * page stride can pass 2^31.
"""
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _fp8_bits_to_fp16(x, KV_KIND: tl.constexpr):
    # x: int8 bytes of fp8 values. Sign-extend to 16 bits, then place exponent and mantissa where
    # fp16 keeps them. e5m2 is the top byte of an fp16. e4m3 lands 3 bits lower; the sign
    # extension also set bit 14 (fp16's top exponent bit), cleared here. The result is the value
    # times 2^-8 (e4m3's exponent bias is 7, fp16's 15), subnormals included.
    w = x.to(tl.int16)
    if KV_KIND == 3:
        w = (w << 7) & -16385  # ~0x4000 as int16
    else:
        w = w << 8
    return w.to(tl.float16, bitcast=True)


@triton.jit
def _group_scales(S, srow, t_mask, sg, quant_group, ROWS: tl.constexpr, COLS: tl.constexpr, RUN: tl.constexpr,
                  VALID: tl.constexpr):
    # Scales of a [ROWS, COLS] tile whose columns come in aligned runs of RUN sharing one group
    # (groups are >= 8 channels): one load per run, broadcast along it. sg: run index.
    s = tl.load(S + srow[:, None] + (sg * (8) // quant_group)[None, :],
                mask=t_mask[:, None] & (sg < VALID)[None, :], other=0.0).to(tl.float32)
    return tl.reshape(tl.broadcast_to(s[:, :, None], [ROWS, COLS // RUN, RUN]), [ROWS, COLS])


@triton.jit
def _load_tile(base, row, cols, mask, S, srow, t_mask, sg, quant_group, KV_KIND: tl.constexpr, DT: tl.constexpr,
               ROWS: tl.constexpr, COLS: tl.constexpr, HEAD_DIM: tl.constexpr):
    x = tl.load(base + row[:, None] + cols[None, :], mask=mask, other=0)
    if KV_KIND == 0:
        return x
    elif KV_KIND == 1:
        s = _group_scales(S, srow, t_mask, sg, quant_group, ROWS, COLS, 8, HEAD_DIM // 8)
        return (x.to(tl.float32) * s).to(DT)
    else:
        return _fp8_bits_to_fp16(x, KV_KIND)


@triton.jit
def _load_int4_tile(base, row, cols, mask, S, srow, t_mask, sg, quant_group, DT: tl.constexpr,
                    ROWS: tl.constexpr, COLS: tl.constexpr, HEAD_DIM: tl.constexpr):
    x = tl.load(base + row[:, None] + cols[None, :], mask=mask, other=0)
    s = _group_scales(S, srow, t_mask, sg, quant_group, ROWS, COLS, 4, HEAD_DIM // 8)
    lo = ((x & 0xF).to(tl.float32) - 7.0) * s
    hi = (((x >> 4) & 0xF).to(tl.float32) - 7.0) * s
    return lo.to(DT), hi.to(DT)


@triton.jit(
    do_not_specialize=[
        "sm_scale", "window", "use_req_idx", "page_size", "max_pages", "stride_table", "q_heads",
        "group", "quant_group", "stride_ksp", "stride_kst", "stride_ksh", "stride_vsp", "stride_vst",
        "stride_vsh",
    ],
    do_not_specialize_on_alignment=["KS", "VS", "Table", "ReqIdx", "SeqLens"],
)
def decode_split_kernel(
    Q, K, V, KS, VS, Table, ReqIdx, SeqLens, PartO, PartLse,
    sm_scale, window, use_req_idx, page_size, max_pages, stride_table, q_heads, group, quant_group,
    stride_qb, stride_qh,
    stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
    stride_ksp, stride_kst, stride_ksh, stride_vsp, stride_vst, stride_vsh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
    KV_KIND: tl.constexpr,
):
    b = tl.program_id(0)
    pid_h = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    h_blocks = tl.cdiv(group, BLOCK_H)
    kvh = pid_h // h_blocks
    offs_g = (pid_h % h_blocks) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs_g < group
    heads = kvh * group + offs_g

    # This split's tokens [lo, hi): lengths past the table are clamped so no read leaves it.
    seq_len = tl.maximum(tl.minimum(tl.load(SeqLens + b), max_pages * page_size), 0)
    start = seq_len * 0
    if window > 0:
        start = tl.maximum(seq_len - window, 0)
    chunk = tl.cdiv(tl.cdiv(seq_len - start, num_splits), BLOCK_N) * BLOCK_N
    lo = start + split * chunk
    hi = tl.minimum(lo + chunk, seq_len)

    row = b
    if use_req_idx != 0:
        row = tl.load(ReqIdx + b)
    table_row = Table + row.to(tl.int64) * stride_table

    FP8: tl.constexpr = KV_KIND >= 3
    INT4: tl.constexpr = KV_KIND == 2
    DT: tl.constexpr = tl.float16 if FP8 else Q.dtype.element_ty
    qk_scale = sm_scale * LOG2E
    v_scale = 1.0
    if FP8:
        # Per-head scale (stride 0 for a scalar); e4m3 bytes were widened to value * 2^-8.
        rebias = 256.0 if KV_KIND == 3 else 1.0
        qk_scale = qk_scale * tl.load(KS + kvh * stride_ksh).to(tl.float32) * rebias
        v_scale = tl.load(VS + kvh * stride_vsh).to(tl.float32) * rebias

    DCOLS: tl.constexpr = BLOCK_D // 2 if INT4 else BLOCK_D
    DVALID: tl.constexpr = HEAD_DIM // 2 if INT4 else HEAD_DIM
    offs_c = tl.arange(0, DCOLS)
    c_mask = offs_c < DVALID
    # Scale column of each stored column; int4 column c holds channels 2c and 2c+1, one group.
    sg = tl.arange(0, BLOCK_D // 8)

    q_rows = Q + b.to(tl.int64) * stride_qb + heads[:, None].to(tl.int64) * stride_qh
    qm = h_mask[:, None] & c_mask[None, :]
    if INT4:
        q = tl.load(q_rows + 2 * offs_c[None, :], mask=qm, other=0.0).to(DT)
        q_odd = tl.load(q_rows + 2 * offs_c[None, :] + 1, mask=qm, other=0.0).to(DT)
        acc_odd = tl.zeros([BLOCK_H, DCOLS], dtype=tl.float32)
    else:
        q = tl.load(q_rows + offs_c[None, :], mask=qm, other=0.0).to(DT)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, DCOLS], dtype=tl.float32)
    kvh64 = kvh.to(tl.int64)

    for t0 in range(lo, hi, BLOCK_N):
        offs_t = t0 + tl.arange(0, BLOCK_N)
        t_mask = offs_t < hi
        page = tl.load(table_row + offs_t // page_size, mask=t_mask, other=0).to(tl.int64)
        slot = (offs_t % page_size).to(tl.int64)
        k_row = page * stride_kp + slot * stride_kt + kvh64 * stride_kh
        v_row = page * stride_vp + slot * stride_vt + kvh64 * stride_vh
        ks_row = page * stride_ksp + slot * stride_kst + kvh64 * stride_ksh
        vs_row = page * stride_vsp + slot * stride_vst + kvh64 * stride_vsh
        mask = t_mask[:, None] & c_mask[None, :]

        if INT4:
            k_lo, k_hi = _load_int4_tile(K, k_row, offs_c, mask, KS, ks_row, t_mask, sg, quant_group, DT, BLOCK_N, DCOLS, HEAD_DIM)
            qk = tl.dot(q, tl.trans(k_lo)) + tl.dot(q_odd, tl.trans(k_hi))
        else:
            k = _load_tile(K, k_row, offs_c, mask, KS, ks_row, t_mask, sg, quant_group, KV_KIND, DT, BLOCK_N, DCOLS, HEAD_DIM)
            qk = tl.dot(q, tl.trans(k))
        qk = tl.where(t_mask[None, :], qk * qk_scale, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
        if INT4:
            v_lo, v_hi = _load_int4_tile(V, v_row, offs_c, mask, VS, vs_row, t_mask, sg, quant_group, DT, BLOCK_N, DCOLS, HEAD_DIM)
            acc = acc * alpha[:, None] + tl.dot(p.to(DT), v_lo)
            acc_odd = acc_odd * alpha[:, None] + tl.dot(p.to(DT), v_hi)
        else:
            v = _load_tile(V, v_row, offs_c, mask, VS, vs_row, t_mask, sg, quant_group, KV_KIND, DT, BLOCK_N, DCOLS, HEAD_DIM)
            acc = acc * alpha[:, None] + tl.dot(p.to(DT), v)

    # Workspace: PartO [batch, q_heads, num_splits, HEAD_DIM], PartLse [batch, q_heads, num_splits].
    slot_ids = (b * q_heads + heads).to(tl.int64) * num_splits + split
    lse = tl.where(hi > lo, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    tl.store(PartLse + slot_ids, lse, mask=h_mask)
    inv_l = v_scale / tl.where(l_i > 0, l_i, 1.0)
    o_rows = PartO + slot_ids[:, None] * HEAD_DIM
    om = (h_mask & (hi > lo))[:, None] & c_mask[None, :]
    if INT4:
        tl.store(o_rows + 2 * offs_c[None, :], acc * inv_l[:, None], mask=om)
        tl.store(o_rows + 2 * offs_c[None, :] + 1, acc_odd * inv_l[:, None], mask=om)
    else:
        tl.store(o_rows + offs_c[None, :], acc * inv_l[:, None], mask=om)


@triton.jit(
    do_not_specialize=["use_sinks", "q_heads", "num_splits"],
    do_not_specialize_on_alignment=["Sinks"],
)
def decode_merge_kernel(
    PartO, PartLse, Sinks, Out,
    use_sinks, q_heads, num_splits,
    stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    slot0 = (b * q_heads + h).to(tl.int64) * num_splits
    lse = tl.load(PartLse + slot0 + offs_s, mask=offs_s < num_splits, other=float("-inf"))
    m = tl.max(lse, 0)
    sink = tl.full([], float("-inf"), tl.float32)
    if use_sinks != 0:
        sink = tl.load(Sinks + h).to(tl.float32) * LOG2E
        m = tl.maximum(m, sink)
    m = tl.where(m == float("-inf"), 0.0, m)  # length 0, no sink: every weight below is 0
    w = tl.exp2(lse - m)
    denom = tl.sum(w, 0) + tl.exp2(sink - m)
    valid = lse > float("-inf")  # empty splits wrote no partial: never read it (may hold NaN)
    o = tl.load(PartO + (slot0 + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
                mask=valid[:, None] & d_mask[None, :], other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.where(denom > 0, denom, 1.0)
    out_ptr = Out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + offs_d
    tl.store(out_ptr, out.to(Out.dtype.element_ty), mask=d_mask)
