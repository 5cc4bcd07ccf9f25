"""KDA chunked prefill precompute in three kernels (chunk.py has the derivation and the state pass).

A chunk's 64 x 64 A (strictly lower, beta and 1 / |k| of row and column) and Aqk (lower with the
diagonal, scale, 1 / |q| and 1 / |k|) split into 16 x 16 blocks:
`kda_chunk_intra` (grid: chunk slots x value heads, one warp a chunk): the four diagonal blocks,
  elementwise: A_ij = sum_c k_ic k_jc exp(G_ic - G_jc), exp of the exact in-block gate sum
  g_{j+1} + ... + g_i (<= 0 for j <= i, safe for any gate). A lane holds two rows of a block and
  BC channels, and sweeps the block's columns from the last, adding one token's gate to the sum
  a column: every load has the same layout, nothing moves between threads, the channel sums stay
  in a thread.
`kda_chunk_inter` (grid: chunk slots x value heads): the six blocks below the diagonal as real
  [16, BK] x [BK, 16] dots a channel step. Row block s, column block r < s, E the cumulative gate
  at the last token before block s: exp(G_i - G_j) = exp(G_i - E) exp(E - G_j), left
  (q or k)_s exp(G_s - E), right k_r exp(E - G_r) = k_r exp(T_r - G'_r) exp(T_{r+1} + ... + T_{s-1})
  (G' the block-local cumulative gate, T a block's total): every factor <= 1, so strong gates
  (-600 over a chunk) underflow to zero instead of overflowing. It writes zeros above the diagonal
  blocks (the inverse and the state pass read whole rows), and from the same tiles the chunk's
  Qg = scale q exp(G) / |q|, Kg = k exp(G_last - G) / |k|, W's operand beta k exp(G) / |k|,
  Fq = 1 and the decay exp(G_last).
`kda_chunk_wy` (grid: chunk slots x value heads): X = (I + A)^-1 by [64, 64] products
  (chunk._inverse_doubling, as GDN), then W = X (W's operand, in place) and U = X (beta v) in
  64-column dots.
A goes through an fp32 workspace Akk [T, HV, 64]; Aqk is the state pass's (input dtype).
"""
import triton
import triton.language as tl

from aotc.kernels.common.schedule import owner_of_block

from .chunk import CHUNK, L2NORM_EPS, SUB, _dot_acc, _inverse_doubling, _wy_dots, _wy_operand

BC = tl.constexpr(4)  # channels a step of kda_chunk_intra: a thread's whole share (16 bytes of fp32 gate)
LOG2E = tl.constexpr(1.4426950408889634)
BK = tl.constexpr(32)  # channels a step of the across-block dots


@triton.jit
def _chunk_of(Cu_seqlens, State_indices, pid, num_seqs, num_slots):
    """(first token, end) of chunk slot pid, end <= first token where there is nothing to do (a
    slot past its sequence, a padded sequence)."""
    n = owner_of_block(Cu_seqlens, pid, num_seqs, CHUNK)
    start = tl.load(Cu_seqlens + n)
    end = tl.load(Cu_seqlens + n + 1)
    t0 = start + (pid - (start // CHUNK + n)) * CHUNK
    slot = tl.load(State_indices + n)
    end = tl.where((slot < 0) | (slot >= num_slots), t0, end)
    return t0, end


@triton.jit
def _tile(P, t, m, s_t, off, c, D):
    """Rows t (int64), channels c of a [T, *, D] input as fp32 (rows past the end, channels past D:
    zeros)."""
    return tl.load(P + t[:, None] * s_t + off + c[None, :], mask=m[:, None] & (c < D)[None, :],
                   other=0.0).to(tl.float32)


@triton.jit
def _inv_norm(ss, qk_l2norm):
    # a select, not a branch (Triton 3.6 failed to lower the branch form: 'unresolved materialization')
    return tl.where(qk_l2norm != 0, 1.0 / tl.sqrt(ss + L2NORM_EPS), 1.0)


@triton.jit
def _col_add(acc, jj, j: tl.constexpr, x, y):
    """acc[:, j] += the channel sum of x y (a thread holds column j of its row)."""
    return acc + tl.where(jj == j, tl.sum(x * y, 1)[:, None], 0.0)


@triton.jit
def _intra_store(Akk, Aqk, a, aq, t, m, row, col0, rq, rk, beta, ck, jj, hv, HV):
    """Rows t (block-local index row) of a diagonal block: Akk strictly lower (beta / |k| of the
    row, 1 / |k| of the column), Aqk lower with the diagonal (scale / |q|, 1 / |k|)."""
    ptrs = (t[:, None] * HV + hv) * CHUNK + col0[:, None] + jj
    tl.store(Akk + ptrs, tl.where(row[:, None] > jj, a * (beta * rk)[:, None] * ck, 0.0), mask=m[:, None])
    tl.store(Aqk + ptrs, tl.where(row[:, None] >= jj, aq * rq[:, None] * ck, 0.0).to(Aqk.dtype.element_ty),
             mask=m[:, None])


@triton.jit(do_not_specialize=["qk_l2norm", "num_seqs", "num_slots", "HV", "group", "s_bt", "s_bh"],
            do_not_specialize_on_alignment=["Cu_seqlens", "State_indices", "Beta"])
def kda_chunk_intra(
    Q, K, G, Beta, Aqk, Akk, Cu_seqlens, State_indices,
    scale, qk_l2norm, num_seqs, num_slots, HV, group, K_DIM,
    s_qt, s_qh, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh,
    HEAD_K: tl.constexpr,
):
    """The four diagonal 16 x 16 blocks of one chunk and value head: Akk and Aqk columns
    [16 b, 16 b + 16) of block b's rows. Grid (chunk slots x HV,), value heads fastest; one warp.
    Lane l holds rows l % 8 (A) and l % 8 + 8 (B) of block l // 8 and BC channels of each: every
    load has one layout, so nothing moves between threads, and the channel sums stay in a thread.
    It sweeps the block's columns j from the last: D = G_row - G_j grows by the gate of token
    j + 1 where j + 1 <= row, so each exp is of an exact in-block gate sum (<= 0 for the pairs
    kept, safe for any gate); columns 8..15 need no A row."""
    pid = tl.program_id(0) // HV
    hv = tl.program_id(0) % HV
    t0, end = _chunk_of(Cu_seqlens, State_indices, pid, num_seqs, num_slots)
    if t0 >= end:
        return
    hk = (hv // group).to(tl.int64)
    hv64 = hv.to(tl.int64)
    i = tl.arange(0, 32)
    rl = i % 8
    t_blk = t0 + (i // 8) * SUB
    t_a = t_blk + rl
    t_b = t_a + 8
    ma = t_a < end
    mb = t_b < end
    t_a = t_a.to(tl.int64)
    t_b = t_b.to(tl.int64)
    jj = tl.arange(0, SUB)[None, :]
    aa = tl.zeros([32, SUB], tl.float32)
    qa = tl.zeros([32, SUB], tl.float32)
    ab = tl.zeros([32, SUB], tl.float32)
    qb = tl.zeros([32, SUB], tl.float32)
    sqa = tl.zeros([32], tl.float32)
    ska = tl.zeros([32], tl.float32)
    sqb = tl.zeros([32], tl.float32)
    skb = tl.zeros([32], tl.float32)
    qp = Q + hk * s_qh
    kp = K + hk * s_kh
    gp = G + hv64 * s_gh
    for c0 in range(0, HEAD_K, BC):
        c = c0 + tl.arange(0, BC)
        xqa = _tile(qp, t_a, ma, s_qt, 0, c, K_DIM)
        xka = _tile(kp, t_a, ma, s_kt, 0, c, K_DIM)
        xqb = _tile(qp, t_b, mb, s_qt, 0, c, K_DIM)
        xkb = _tile(kp, t_b, mb, s_kt, 0, c, K_DIM)
        sqa += tl.sum(xqa * xqa, 1)
        ska += tl.sum(xka * xka, 1)
        sqb += tl.sum(xqb * xqb, 1)
        skb += tl.sum(xkb * xkb, 1)
        da = tl.zeros([32, BC], tl.float32)
        db = tl.zeros([32, BC], tl.float32)
        for j in tl.static_range(SUB - 1, -1, -1):
            if j < SUB - 1:
                tn = t_blk + j + 1
                gn = _tile(gp, tn.to(tl.int64), tn < end, s_gt, 0, c, K_DIM) * LOG2E
                db += tl.where((rl + 8 > j)[:, None], gn, 0.0)
                if j < 7:
                    da += tl.where((rl > j)[:, None], gn, 0.0)
            tj = t_blk + j
            kc = _tile(kp, tj.to(tl.int64), tj < end, s_kt, 0, c, K_DIM)
            kj = kc * tl.exp2(db)
            ab = _col_add(ab, jj, j, xkb, kj)
            qb = _col_add(qb, jj, j, xqb, kj)
            if j < 8:
                kj = kc * tl.exp2(da)
                aa = _col_add(aa, jj, j, xka, kj)
                qa = _col_add(qa, jj, j, xqa, kj)
    rka = _inv_norm(ska, qk_l2norm)
    rkb = _inv_norm(skb, qk_l2norm)
    # the columns' 1 / |k|: column j of a lane's block is row j % 8 of lane (l // 8) * 8 + j % 8
    ck = tl.gather(tl.where(jj < 8, rka[:, None], rkb[:, None]), (i // 8 * 8)[:, None] + jj % 8, 0)
    col0 = (i // 8) * SUB
    ba = tl.load(Beta + t_a * s_bt + hv64 * s_bh, mask=ma, other=0.0)
    bb = tl.load(Beta + t_b * s_bt + hv64 * s_bh, mask=mb, other=0.0)
    _intra_store(Akk, Aqk, aa, qa, t_a, ma, rl, col0, _inv_norm(sqa, qk_l2norm) * scale, rka, ba, ck, jj, hv64, HV)
    _intra_store(Akk, Aqk, ab, qb, t_b, mb, rl + 8, col0, _inv_norm(sqb, qk_l2norm) * scale, rkb, bb, ck, jj, hv64, HV)


@triton.jit
def _block_step(Q, K, G, t0, b: tl.constexpr, end, hk, hv, s_qt, s_qh, s_kt, s_kh, s_gt, s_gh, c, K_DIM):
    """q, k [16, BK] fp32 of block b and its block-local cumulative gate."""
    t = t0 + b * SUB + tl.arange(0, SUB)
    m = t < end
    t = t.to(tl.int64)
    q = _tile(Q, t, m, s_qt, hk * s_qh, c, K_DIM)
    k = _tile(K, t, m, s_kt, hk * s_kh, c, K_DIM)
    g = _tile(G, t, m, s_gt, hv * s_gh, c, K_DIM)
    return q, k, tl.cumsum(g, 0)


@triton.jit
def _block_total(G, t0, b: tl.constexpr, end, hv, s_gt, s_gh, c, K_DIM):
    """The sum of block b's gates [BK] (tokens past the end read 0)."""
    t = t0 + b * SUB + tl.arange(0, SUB)
    return tl.sum(_tile(G, t.to(tl.int64), t < end, s_gt, hv * s_gh, c, K_DIM), 0)


@triton.jit
def _block_norms(Q, K, Beta, t0, b: tl.constexpr, end, hk, hv, s_qt, s_qh, s_kt, s_kh, s_bt, s_bh, K_DIM, scale,
                 qk_l2norm, HEAD_K: tl.constexpr):
    """Block b's row factors: scale / |q| (Qg, Aqk), 1 / |k| (Kg, a column of A or Aqk), beta / |k|
    (W's operand, a row of A); ones in place of the norms without qk_l2norm."""
    t = t0 + b * SUB + tl.arange(0, SUB)
    m = t < end
    t = t.to(tl.int64)
    sq = tl.zeros([SUB], tl.float32)
    sk = tl.zeros([SUB], tl.float32)
    for c0 in tl.static_range(0, HEAD_K, BK):
        c = c0 + tl.arange(0, BK)
        x = _tile(Q, t, m, s_qt, hk * s_qh, c, K_DIM)
        sq += tl.sum(x * x, 1)
        x = _tile(K, t, m, s_kt, hk * s_kh, c, K_DIM)
        sk += tl.sum(x * x, 1)
    rk = _inv_norm(sk, qk_l2norm)
    beta = tl.load(Beta + t * s_bt + hv * s_bh, mask=m, other=0.0)
    return scale * _inv_norm(sq, qk_l2norm), rk, beta * rk


@triton.jit
def _store_gated(Qg, Kg, W, q, k, e, d, before, after, rq, rk, wk, t0, b: tl.constexpr, end, hv, HV, c,
                 HEAD_K: tl.constexpr):
    """Block b's channels c of Qg = scale q exp(G) / |q|, Kg = k exp(G_last - G) / |k| and W's
    operand beta k exp(G) / |k| (kda_chunk_wy multiplies it by X in place): e = exp(G'), d =
    exp(T_b - G') (G' block-local), before = exp(the blocks before), after = exp(the blocks after);
    every factor <= 1."""
    t = t0 + b * SUB + tl.arange(0, SUB)
    ws = (t.to(tl.int64)[:, None] * HV + hv) * HEAD_K + c[None, :]
    m = (t < end)[:, None]
    eg = e * before[None, :]
    tl.store(Qg + ws, (q * rq[:, None] * eg).to(Qg.dtype.element_ty), mask=m)
    tl.store(Kg + ws, (k * rk[:, None] * d * after[None, :]).to(Kg.dtype.element_ty), mask=m)
    tl.store(W + ws, (k * wk[:, None] * eg).to(W.dtype.element_ty), mask=m)


@triton.jit
def _store_block(Akk, Aqk, a, aq, t0, s: tl.constexpr, r: tl.constexpr, end, hv, HV):
    """Block (s, r) of the chunk's A (fp32) and Aqk (input dtype)."""
    i = tl.arange(0, SUB)
    t = t0 + s * SUB + i
    ptrs = (t.to(tl.int64)[:, None] * HV + hv) * CHUNK + r * SUB + i[None, :]
    tl.store(Akk + ptrs, a, mask=(t < end)[:, None])
    tl.store(Aqk + ptrs, aq.to(Aqk.dtype.element_ty), mask=(t < end)[:, None])


@triton.jit(do_not_specialize=["qk_l2norm", "num_seqs", "num_slots", "HV", "group", "s_gt", "s_gh", "s_bt", "s_bh"],
            do_not_specialize_on_alignment=["Cu_seqlens", "State_indices", "G", "Beta"])
def kda_chunk_inter(
    Q, K, G, Beta, W, Qg, Fq, Kg, Aqk, Akk, Decay, Cu_seqlens, State_indices,
    scale, qk_l2norm, num_seqs, num_slots, HV, group, K_DIM,
    s_qt, s_qh, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh,
    HEAD_K: tl.constexpr, TF32: tl.constexpr,
):
    """The blocks off the diagonal of one chunk and value head: (s, r) for r < s by dots (see the
    module docstring), zeros for r > s; on the way the chunk's Qg, Kg, W operand rows, Fq = 1 and
    Decay[slot, hv, :] = exp(G_last). Grid (chunk slots x HV,), value heads fastest.
    Block by block a channel step: block r's right operands for the later row blocks are formed
    once (bf16 for bf16 inputs) and used as those rows come, so no fp32 tile of another block stays
    live."""
    pid = tl.program_id(0) // HV
    hv = tl.program_id(0) % HV
    t0, end = _chunk_of(Cu_seqlens, State_indices, pid, num_seqs, num_slots)
    if t0 >= end:
        return
    DT: tl.constexpr = Q.dtype.element_ty
    hk = (hv // group).to(tl.int64)
    hv64 = hv.to(tl.int64)
    rq0, rk0, wk0 = _block_norms(Q, K, Beta, t0, 0, end, hk, hv64, s_qt, s_qh, s_kt, s_kh, s_bt, s_bh, K_DIM, scale,
                                 qk_l2norm, HEAD_K)
    rq1, rk1, wk1 = _block_norms(Q, K, Beta, t0, 1, end, hk, hv64, s_qt, s_qh, s_kt, s_kh, s_bt, s_bh, K_DIM, scale,
                                 qk_l2norm, HEAD_K)
    rq2, rk2, wk2 = _block_norms(Q, K, Beta, t0, 2, end, hk, hv64, s_qt, s_qh, s_kt, s_kh, s_bt, s_bh, K_DIM, scale,
                                 qk_l2norm, HEAD_K)
    rq3, rk3, wk3 = _block_norms(Q, K, Beta, t0, 3, end, hk, hv64, s_qt, s_qh, s_kt, s_kh, s_bt, s_bh, K_DIM, scale,
                                 qk_l2norm, HEAD_K)
    tc = t0 + tl.arange(0, CHUNK)
    tl.store(Fq + tc.to(tl.int64) * HV + hv64, tl.full([CHUNK], 1.0, tl.float32), mask=tc < end)
    z = tl.zeros([SUB, SUB], tl.float32)
    a10, a20, a21, a30, a31, a32 = z, z, z, z, z, z
    q10, q20, q21, q30, q31, q32 = z, z, z, z, z, z
    one = tl.full([BK], 1.0, tl.float32)
    for c0 in range(0, HEAD_K, BK):
        c = c0 + tl.arange(0, BK)
        T0 = _block_total(G, t0, 0, end, hv64, s_gt, s_gh, c, K_DIM)
        T1 = _block_total(G, t0, 1, end, hv64, s_gt, s_gh, c, K_DIM)
        T2 = _block_total(G, t0, 2, end, hv64, s_gt, s_gh, c, K_DIM)
        T3 = _block_total(G, t0, 3, end, hv64, s_gt, s_gh, c, K_DIM)
        tl.store(Decay + (pid.to(tl.int64) * HV + hv64) * HEAD_K + c, tl.exp(T0 + T1 + T2 + T3))
        x1 = tl.exp(T1)
        x2 = tl.exp(T2)
        x3 = tl.exp(T3)
        # block 0: rows of Qg, Kg, W; right operands k_0 exp(E_s - G_0) for row blocks 1, 2, 3
        q, k, gl = _block_step(Q, K, G, t0, 0, end, hk, hv64, s_qt, s_qh, s_kt, s_kh, s_gt, s_gh, c, K_DIM)
        e = tl.exp(gl)
        d = tl.exp(T0[None, :] - gl)
        _store_gated(Qg, Kg, W, q, k, e, d, one, x1 * x2 * x3, rq0, rk0, wk0, t0, 0, end, hv64, HV, c, HEAD_K)
        r = k * d
        r01 = tl.trans(r.to(DT))
        r02 = tl.trans((r * x1[None, :]).to(DT))
        r03 = tl.trans((r * (x1 * x2)[None, :]).to(DT))
        # block 1: left operands k_1 exp(G'_1), q_1 exp(G'_1) against block 0
        q, k, gl = _block_step(Q, K, G, t0, 1, end, hk, hv64, s_qt, s_qh, s_kt, s_kh, s_gt, s_gh, c, K_DIM)
        e = tl.exp(gl)
        d = tl.exp(T1[None, :] - gl)
        _store_gated(Qg, Kg, W, q, k, e, d, tl.exp(T0), x2 * x3, rq1, rk1, wk1, t0, 1, end, hv64, HV, c, HEAD_K)
        lk = (k * e).to(DT)
        lq = (q * e).to(DT)
        a10 = _dot_acc(lk, r01, a10, TF32)
        q10 = _dot_acc(lq, r01, q10, TF32)
        r = k * d
        r12 = tl.trans(r.to(DT))
        r13 = tl.trans((r * x2[None, :]).to(DT))
        # block 2
        q, k, gl = _block_step(Q, K, G, t0, 2, end, hk, hv64, s_qt, s_qh, s_kt, s_kh, s_gt, s_gh, c, K_DIM)
        e = tl.exp(gl)
        d = tl.exp(T2[None, :] - gl)
        _store_gated(Qg, Kg, W, q, k, e, d, tl.exp(T0 + T1), x3, rq2, rk2, wk2, t0, 2, end, hv64, HV, c, HEAD_K)
        lk = (k * e).to(DT)
        lq = (q * e).to(DT)
        a20 = _dot_acc(lk, r02, a20, TF32)
        q20 = _dot_acc(lq, r02, q20, TF32)
        a21 = _dot_acc(lk, r12, a21, TF32)
        q21 = _dot_acc(lq, r12, q21, TF32)
        r23 = tl.trans((k * d).to(DT))
        # block 3
        q, k, gl = _block_step(Q, K, G, t0, 3, end, hk, hv64, s_qt, s_qh, s_kt, s_kh, s_gt, s_gh, c, K_DIM)
        e = tl.exp(gl)
        d = tl.exp(T3[None, :] - gl)
        _store_gated(Qg, Kg, W, q, k, e, d, tl.exp(T0 + T1 + T2), one, rq3, rk3, wk3, t0, 3, end, hv64, HV, c,
                     HEAD_K)
        lk = (k * e).to(DT)
        lq = (q * e).to(DT)
        a30 = _dot_acc(lk, r03, a30, TF32)
        q30 = _dot_acc(lq, r03, q30, TF32)
        a31 = _dot_acc(lk, r13, a31, TF32)
        q31 = _dot_acc(lq, r13, q31, TF32)
        a32 = _dot_acc(lk, r23, a32, TF32)
        q32 = _dot_acc(lq, r23, q32, TF32)
    # A: rows beta / |k|, Aqk: rows scale / |q|; columns 1 / |k|
    c0f = rk0[None, :]
    c1f = rk1[None, :]
    c2f = rk2[None, :]
    _store_block(Akk, Aqk, a10 * wk1[:, None] * c0f, q10 * rq1[:, None] * c0f, t0, 1, 0, end, hv64, HV)
    _store_block(Akk, Aqk, a20 * wk2[:, None] * c0f, q20 * rq2[:, None] * c0f, t0, 2, 0, end, hv64, HV)
    _store_block(Akk, Aqk, a21 * wk2[:, None] * c1f, q21 * rq2[:, None] * c1f, t0, 2, 1, end, hv64, HV)
    _store_block(Akk, Aqk, a30 * wk3[:, None] * c0f, q30 * rq3[:, None] * c0f, t0, 3, 0, end, hv64, HV)
    _store_block(Akk, Aqk, a31 * wk3[:, None] * c1f, q31 * rq3[:, None] * c1f, t0, 3, 1, end, hv64, HV)
    _store_block(Akk, Aqk, a32 * wk3[:, None] * c2f, q32 * rq3[:, None] * c2f, t0, 3, 2, end, hv64, HV)
    _store_block(Akk, Aqk, z, z, t0, 0, 1, end, hv64, HV)
    _store_block(Akk, Aqk, z, z, t0, 0, 2, end, hv64, HV)
    _store_block(Akk, Aqk, z, z, t0, 0, 3, end, hv64, HV)
    _store_block(Akk, Aqk, z, z, t0, 1, 2, end, hv64, HV)
    _store_block(Akk, Aqk, z, z, t0, 1, 3, end, hv64, HV)
    _store_block(Akk, Aqk, z, z, t0, 2, 3, end, hv64, HV)


@triton.jit(do_not_specialize=["num_seqs", "num_slots", "HV", "s_bt", "s_bh"],
            do_not_specialize_on_alignment=["Cu_seqlens", "State_indices", "Beta"])
def kda_chunk_wy(
    Akk, V, Beta, W, U, Cu_seqlens, State_indices,
    num_seqs, num_slots, HV, K_DIM, V_DIM, s_vt, s_vh, s_bt, s_bh,
    HEAD_K: tl.constexpr, HEAD_V: tl.constexpr, MERGE_TF32: tl.constexpr,
):
    """One chunk of one value head: X = (I + A)^-1 of A (Akk), then W = X W (in place: the chunk's
    W operand rows, read before they are written, by this program alone) and U = X (beta v).
    Grid (chunk slots x HV,), value heads fastest. bf16 inputs on CUDA: the inverse's products on bf16
    operands, as gdn_chunk_prep's (chunk._mm)."""
    pid = tl.program_id(0) // HV
    hv = tl.program_id(0) % HV
    t0, end = _chunk_of(Cu_seqlens, State_indices, pid, num_seqs, num_slots)
    if t0 >= end:
        return
    EXACT: tl.constexpr = V.dtype.element_ty == tl.float32
    BFM: tl.constexpr = (MERGE_TF32 != 0) and (V.dtype.element_ty == tl.bfloat16)  # as gdn_chunk_prep's
    DTW: tl.constexpr = W.dtype.element_ty
    hv64 = hv.to(tl.int64)
    t = t0 + tl.arange(0, CHUNK)
    m = t < end
    t = t.to(tl.int64)
    cc = tl.arange(0, CHUNK)
    a = tl.load(Akk + (t[:, None] * HV + hv64) * CHUNK + cc[None, :], mask=m[:, None], other=0.0)
    x = _wy_operand(_inverse_doubling(a, MERGE_TF32, EXACT, BFM), DTW)
    # W's operand rows are read before this program overwrites them (in place)
    _wy_dots(W, U, x, W, HV * HEAD_K, hv64 * HEAD_K, 0.0, V, s_vt, hv64 * s_vh, Beta, s_bt, s_bh, t, m, hv64, HV,
             K_DIM, V_DIM, HEAD_K, HEAD_V, MERGE_TF32, EXACT, False)
