"""KDA chunked prefill precompute in three kernels (chunk.py has the derivation and the state pass).

A chunk's 64 x 64 A (strictly lower, beta and 1 / |k| of row and column) and Aqk (lower with the
diagonal, scale, 1 / |q| and 1 / |k|) split into 16 x 16 blocks:
`kda_chunk_intra` (grid: chunk slots x 4 row blocks x value heads, one 16-token block a program):
  the four diagonal blocks, elementwise: A_ij = sum_c k_ic k_jc exp(G_ic - G_jc) over a
  [16, 16, BC] tile a channel step, exp of the exact difference (<= 0 for j <= i, safe for any
  gate), reduced over the channels. The cumulative gate is the block's own (the differences need
  no more).
`kda_chunk_inter` (grid: chunk slots x value heads): the six blocks below the diagonal as real
  [16, BK] x [BK, 16] dots a channel step. Row block s, column block r < s, E the cumulative gate
  at the last token before block s: exp(G_i - G_j) = exp(G_i - E) exp(E - G_j), left
  (q or k)_s exp(G_s - E), right k_r exp(E - G_r) = k_r exp(T_r - G'_r) exp(T_{r+1} + ... + T_{s-1})
  (G' the block-local cumulative gate, T a block's total): every factor <= 1, so strong gates
  (-600 over a chunk) underflow to zero instead of overflowing. It writes zeros above the diagonal
  blocks (the inverse and the state pass read whole rows).
`kda_chunk_wy` (grid: chunk slots x value heads): X = (I + A)^-1 by [64, 64] products
  (chunk._inverse_doubling, as GDN), then by 64-column blocks Qg = scale q exp(G) / |q|,
  Kg = k exp(G_last - G) / |k|, the decay exp(G_last), W = X (beta k exp(G) / |k|), U = X (beta v),
  and Fq = 1.
A goes through an fp32 workspace Akk [T, HV, 64]; Aqk is the state pass's (input dtype).
"""
import triton
import triton.language as tl

from aotc.kernels.common.schedule import owner_of_block

from .chunk import (CHUNK, L2NORM_EPS, SUB, WCOL, _chunk_cols, _dot_acc, _inverse_doubling, _mm, _store_cols,
                    _wy_operand)

BC = tl.constexpr(16)  # channels a step of the in-block [16, 16, BC] tiles
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


@triton.jit(do_not_specialize=["qk_l2norm", "num_seqs", "num_slots", "HV", "group", "s_gt", "s_gh", "s_bt", "s_bh"],
            do_not_specialize_on_alignment=["Cu_seqlens", "State_indices", "G", "Beta"])
def kda_chunk_intra(
    Q, K, G, Beta, Aqk, Akk, Cu_seqlens, State_indices,
    scale, qk_l2norm, num_seqs, num_slots, HV, group, K_DIM,
    s_qt, s_qh, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh,
    HEAD_K: tl.constexpr,
):
    """The diagonal 16 x 16 block of row block i of one chunk and value head: Akk and Aqk columns
    [16 i, 16 i + 16) of the block's rows. Grid (chunk slots x 4 x HV,): value heads fastest, then
    the chunk's blocks (neighbouring programs share q, k rows through L2)."""
    blk = tl.program_id(0) // HV
    hv = tl.program_id(0) % HV
    pid = blk // 4
    i = blk % 4
    t0, end = _chunk_of(Cu_seqlens, State_indices, pid, num_seqs, num_slots)
    if t0 + i * SUB >= end:
        return
    hk = (hv // group).to(tl.int64)
    hv64 = hv.to(tl.int64)
    r = tl.arange(0, SUB)
    t = t0 + i * SUB + r
    m = t < end
    t = t.to(tl.int64)
    low = (r[:, None] >= r[None, :])[:, :, None]
    a = tl.zeros([SUB, SUB], tl.float32)
    aq = tl.zeros([SUB, SUB], tl.float32)
    ssq = tl.zeros([SUB], tl.float32)
    ssk = tl.zeros([SUB], tl.float32)
    for c0 in range(0, HEAD_K, BC):
        c = c0 + tl.arange(0, BC)
        q = _tile(Q, t, m, s_qt, hk * s_qh, c, K_DIM)
        k = _tile(K, t, m, s_kt, hk * s_kh, c, K_DIM)
        gl = tl.cumsum(_tile(G, t, m, s_gt, hv64 * s_gh, c, K_DIM), 0)  # from the block's start
        ssq += tl.sum(q * q, 1)
        ssk += tl.sum(k * k, 1)
        # [row i, column j, channel]: exp(G_i - G_j) exactly, <= 1 where j <= i, 0 above
        kj = k[None, :, :] * tl.exp(tl.where(low, gl[:, None, :] - gl[None, :, :], float("-inf")))
        a += tl.sum(k[:, None, :] * kj, 2)
        aq += tl.sum(q[:, None, :] * kj, 2)
    rq = _inv_norm(ssq, qk_l2norm)
    rk = _inv_norm(ssk, qk_l2norm)
    beta = tl.load(Beta + t * s_bt + hv64 * s_bh, mask=m, other=0.0)
    a = tl.where(r[:, None] > r[None, :], a * (beta * rk)[:, None] * rk[None, :], 0.0)
    aq = aq * (rq * scale)[:, None] * rk[None, :]
    ptrs = (t[:, None] * HV + hv64) * CHUNK + i * SUB + r[None, :]
    tl.store(Akk + ptrs, a, mask=m[:, None])
    tl.store(Aqk + ptrs, aq.to(Aqk.dtype.element_ty), mask=m[:, None])


@triton.jit
def _block_step(Q, K, G, t0, b: tl.constexpr, end, hk, hv, s_qt, s_qh, s_kt, s_kh, s_gt, s_gh, c, K_DIM):
    """q, k [16, BK] fp32 of block b, its block-local cumulative gate and its total [BK]."""
    t = t0 + b * SUB + tl.arange(0, SUB)
    m = t < end
    t = t.to(tl.int64)
    q = _tile(Q, t, m, s_qt, hk * s_qh, c, K_DIM)
    k = _tile(K, t, m, s_kt, hk * s_kh, c, K_DIM)
    g = _tile(G, t, m, s_gt, hv * s_gh, c, K_DIM)
    return q, k, tl.cumsum(g, 0), tl.sum(g, 0)


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
    Q, K, G, Beta, Aqk, Akk, Cu_seqlens, State_indices,
    scale, qk_l2norm, num_seqs, num_slots, HV, group, K_DIM,
    s_qt, s_qh, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh,
    HEAD_K: tl.constexpr, TF32: tl.constexpr,
):
    """The blocks off the diagonal of one chunk and value head: (s, r) for r < s by dots (see the
    module docstring), zeros for r > s. Grid (chunk slots x HV,), value heads fastest."""
    pid = tl.program_id(0) // HV
    hv = tl.program_id(0) % HV
    t0, end = _chunk_of(Cu_seqlens, State_indices, pid, num_seqs, num_slots)
    if t0 >= end:
        return
    DT: tl.constexpr = Q.dtype.element_ty
    hk = (hv // group).to(tl.int64)
    hv64 = hv.to(tl.int64)
    z = tl.zeros([SUB, SUB], tl.float32)
    a10, a20, a21, a30, a31, a32 = z, z, z, z, z, z
    q10, q20, q21, q30, q31, q32 = z, z, z, z, z, z
    zs = tl.zeros([SUB], tl.float32)
    sk0, sk1, sk2, sk3, sq1, sq2, sq3 = zs, zs, zs, zs, zs, zs, zs
    for c0 in range(0, HEAD_K, BK):
        c = c0 + tl.arange(0, BK)
        _q0, k0, g0, T0 = _block_step(Q, K, G, t0, 0, end, hk, hv64, s_qt, s_qh, s_kt, s_kh, s_gt, s_gh, c, K_DIM)
        q1, k1, g1, T1 = _block_step(Q, K, G, t0, 1, end, hk, hv64, s_qt, s_qh, s_kt, s_kh, s_gt, s_gh, c, K_DIM)
        q2, k2, g2, T2 = _block_step(Q, K, G, t0, 2, end, hk, hv64, s_qt, s_qh, s_kt, s_kh, s_gt, s_gh, c, K_DIM)
        q3, k3, g3, _T3 = _block_step(Q, K, G, t0, 3, end, hk, hv64, s_qt, s_qh, s_kt, s_kh, s_gt, s_gh, c, K_DIM)
        sk0 += tl.sum(k0 * k0, 1)
        sk1 += tl.sum(k1 * k1, 1)
        sk2 += tl.sum(k2 * k2, 1)
        sk3 += tl.sum(k3 * k3, 1)
        sq1 += tl.sum(q1 * q1, 1)
        sq2 += tl.sum(q2 * q2, 1)
        sq3 += tl.sum(q3 * q3, 1)
        # right operands: k_r exp(T_r - G'_r), the gate from token j to block r's end (<= 0)
        r0 = k0 * tl.exp(T0[None, :] - g0)
        r1 = k1 * tl.exp(T1[None, :] - g1)
        r2 = k2 * tl.exp(T2[None, :] - g2)
        # left operands of row block s: exp(G'_s) = exp(G_s - E), E the gate before block s
        e1 = tl.exp(g1)
        e2 = tl.exp(g2)
        e3 = tl.exp(g3)
        l1, m1 = (k1 * e1).to(DT), (q1 * e1).to(DT)
        l2, m2 = (k2 * e2).to(DT), (q2 * e2).to(DT)
        l3, m3 = (k3 * e3).to(DT), (q3 * e3).to(DT)
        x = tl.trans(r0.to(DT))
        a10 = _dot_acc(l1, x, a10, TF32)
        q10 = _dot_acc(m1, x, q10, TF32)
        x = tl.trans(r1.to(DT))
        a21 = _dot_acc(l2, x, a21, TF32)
        q21 = _dot_acc(m2, x, q21, TF32)
        x = tl.trans(r2.to(DT))
        a32 = _dot_acc(l3, x, a32, TF32)
        q32 = _dot_acc(m3, x, q32, TF32)
        # two blocks apart: the block between's total gate, per channel (<= 0)
        x = tl.trans((r0 * tl.exp(T1)[None, :]).to(DT))
        a20 = _dot_acc(l2, x, a20, TF32)
        q20 = _dot_acc(m2, x, q20, TF32)
        x = tl.trans((r1 * tl.exp(T2)[None, :]).to(DT))
        a31 = _dot_acc(l3, x, a31, TF32)
        q31 = _dot_acc(m3, x, q31, TF32)
        x = tl.trans((r0 * tl.exp(T1 + T2)[None, :]).to(DT))
        a30 = _dot_acc(l3, x, a30, TF32)
        q30 = _dot_acc(m3, x, q30, TF32)
    i = tl.arange(0, SUB)
    rk0 = _inv_norm(sk0, qk_l2norm)
    rk1 = _inv_norm(sk1, qk_l2norm)
    rk2 = _inv_norm(sk2, qk_l2norm)
    # row factors: A beta / |k|, Aqk scale / |q|; column factor 1 / |k|
    b1 = tl.load(Beta + (t0 + SUB + i).to(tl.int64) * s_bt + hv64 * s_bh, mask=t0 + SUB + i < end, other=0.0)
    b2 = tl.load(Beta + (t0 + 2 * SUB + i).to(tl.int64) * s_bt + hv64 * s_bh, mask=t0 + 2 * SUB + i < end, other=0.0)
    b3 = tl.load(Beta + (t0 + 3 * SUB + i).to(tl.int64) * s_bt + hv64 * s_bh, mask=t0 + 3 * SUB + i < end, other=0.0)
    fa1 = (b1 * rk1)[:, None]
    fa2 = (b2 * _inv_norm(sk2, qk_l2norm))[:, None]
    fa3 = (b3 * _inv_norm(sk3, qk_l2norm))[:, None]
    fq1 = (scale * _inv_norm(sq1, qk_l2norm))[:, None]
    fq2 = (scale * _inv_norm(sq2, qk_l2norm))[:, None]
    fq3 = (scale * _inv_norm(sq3, qk_l2norm))[:, None]
    c0f = rk0[None, :]
    c1f = rk1[None, :]
    c2f = rk2[None, :]
    _store_block(Akk, Aqk, a10 * fa1 * c0f, q10 * fq1 * c0f, t0, 1, 0, end, hv64, HV)
    _store_block(Akk, Aqk, a20 * fa2 * c0f, q20 * fq2 * c0f, t0, 2, 0, end, hv64, HV)
    _store_block(Akk, Aqk, a21 * fa2 * c1f, q21 * fq2 * c1f, t0, 2, 1, end, hv64, HV)
    _store_block(Akk, Aqk, a30 * fa3 * c0f, q30 * fq3 * c0f, t0, 3, 0, end, hv64, HV)
    _store_block(Akk, Aqk, a31 * fa3 * c1f, q31 * fq3 * c1f, t0, 3, 1, end, hv64, HV)
    _store_block(Akk, Aqk, a32 * fa3 * c2f, q32 * fq3 * c2f, t0, 3, 2, end, hv64, HV)
    _store_block(Akk, Aqk, z, z, t0, 0, 1, end, hv64, HV)
    _store_block(Akk, Aqk, z, z, t0, 0, 2, end, hv64, HV)
    _store_block(Akk, Aqk, z, z, t0, 0, 3, end, hv64, HV)
    _store_block(Akk, Aqk, z, z, t0, 1, 2, end, hv64, HV)
    _store_block(Akk, Aqk, z, z, t0, 1, 3, end, hv64, HV)
    _store_block(Akk, Aqk, z, z, t0, 2, 3, end, hv64, HV)


@triton.jit(do_not_specialize=["qk_l2norm", "num_seqs", "num_slots", "HV", "group", "s_gt", "s_gh", "s_bt", "s_bh"],
            do_not_specialize_on_alignment=["Cu_seqlens", "State_indices", "G", "Beta"])
def kda_chunk_wy(
    Q, K, V, G, Beta, Akk, W, U, Qg, Fq, Kg, Decay, Cu_seqlens, State_indices,
    scale, qk_l2norm, num_seqs, num_slots, HV, group, K_DIM, V_DIM,
    s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_gt, s_gh, s_bt, s_bh,
    HEAD_K: tl.constexpr, HEAD_V: tl.constexpr, MERGE_TF32: tl.constexpr,
):
    """One chunk of one value head from its A (Akk): X = (I + A)^-1, then W, U, Qg, Kg, Fq rows and
    Decay[slot, hv, :] (see the module docstring). Grid (chunk slots x HV,), value heads fastest."""
    pid = tl.program_id(0) // HV
    hv = tl.program_id(0) % HV
    t0, end = _chunk_of(Cu_seqlens, State_indices, pid, num_seqs, num_slots)
    if t0 >= end:
        return
    EXACT: tl.constexpr = Q.dtype.element_ty == tl.float32
    hk = (hv // group).to(tl.int64)
    hv64 = hv.to(tl.int64)
    t = t0 + tl.arange(0, CHUNK)
    m = t < end
    t = t.to(tl.int64)
    cc = tl.arange(0, CHUNK)
    a = tl.load(Akk + (t[:, None] * HV + hv64) * CHUNK + cc[None, :], mask=m[:, None], other=0.0)
    ssq = tl.zeros([CHUNK], tl.float32)
    ssk = tl.zeros([CHUNK], tl.float32)
    for c0 in tl.static_range(0, HEAD_K, WCOL):
        x = _chunk_cols(Q, t, m, s_qt, hk * s_qh, c0, K_DIM)
        ssq += tl.sum(x * x, 1)
        x = _chunk_cols(K, t, m, s_kt, hk * s_kh, c0, K_DIM)
        ssk += tl.sum(x * x, 1)
    rq = _inv_norm(ssq, qk_l2norm) * scale
    rk = _inv_norm(ssk, qk_l2norm)
    tl.store(Fq + t * HV + hv64, tl.full([CHUNK], 1.0, tl.float32), mask=m)
    xw = _wy_operand(_inverse_doubling(a, MERGE_TF32, EXACT), W.dtype.element_ty)
    fk = tl.load(Beta + t * s_bt + hv64 * s_bh, mask=m, other=0.0)
    kw = fk * rk
    for c0 in tl.static_range(0, HEAD_K, WCOL):
        c = c0 + tl.arange(0, WCOL)
        cm = m[:, None] & (c < K_DIM)[None, :]
        gc = tl.load(G + t[:, None] * s_gt + hv64 * s_gh + c[None, :], mask=cm, other=0.0)
        Gc = tl.cumsum(gc, 0)
        RLc = tl.sum(gc, 0)  # the gate at the chunk's last token (past the end g reads 0)
        tl.store(Decay + (pid.to(tl.int64) * HV + hv64) * HEAD_K + c, tl.exp(RLc))
        eg = tl.exp(Gc)
        ws = (t[:, None] * HV + hv64) * HEAD_K + c[None, :]
        qc = tl.load(Q + t[:, None] * s_qt + hk * s_qh + c[None, :], mask=cm, other=0.0).to(tl.float32)
        tl.store(Qg + ws, (qc * rq[:, None] * eg).to(Qg.dtype.element_ty), mask=m[:, None])
        kc = tl.load(K + t[:, None] * s_kt + hk * s_kh + c[None, :], mask=cm, other=0.0).to(tl.float32)
        tl.store(Kg + ws, (kc * rk[:, None] * tl.exp(RLc[None, :] - Gc)).to(Kg.dtype.element_ty), mask=m[:, None])
        kc = _wy_operand(kc * kw[:, None] * eg, W.dtype.element_ty)
        tl.store(W + ws, _mm(xw, kc, MERGE_TF32, EXACT).to(W.dtype.element_ty), mask=m[:, None])
    for c0 in tl.static_range(0, HEAD_V, WCOL):
        vc = _chunk_cols(V, t, m, s_vt, hv64 * s_vh, c0, V_DIM) * fk[:, None]
        _store_cols(U, _mm(xw, _wy_operand(vc, W.dtype.element_ty), MERGE_TF32, EXACT), t, m, hv64, HV, c0, HEAD_V)
