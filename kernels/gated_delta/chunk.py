"""Chunked gated delta rule (prefill): GDN (one log-gate a head) and KDA (one a head and K channel).

Derivation (from reference.py's recurrence; the same WY form as flash-linear-attention's
chunk_gated_delta_rule). State S [V, K] per value head; in a chunk of C = 64 tokens starting
from S0, with G_i the in-chunk cumulative log-gate (a scalar, or a [K] vector for KDA) and
Gam_i = exp(G_i), the pre-update values v'_i = beta_i (v_i - S~_i k_i) satisfy

    v'_i + sum_{j<i} A_ij v'_j = beta_i v_i - beta_i S0 (Gam_i * k_i),
    A_ij = beta_i sum_c k_ic k_jc exp(G_ic - G_jc)                      (strictly lower)

so with X = (I + A)^-1:  W = X (beta k Gam),  U = X (beta v),  V' = U - W S0^T, and

    O   = scale (q Gam) S0^T + Aqk V',   Aqk_ij = scale sum_c q_ic k_jc exp(G_ic - G_jc)  (j <= i)
    S_C = S0 exp(G_last) + V'^T (k exp(G_last - G)).

Two kernels. `gdn_chunk_prep` (grid: chunk slots x value heads, every chunk in parallel) builds
A and Aqk in 16-row sub-blocks (one row block's q, k, gate live at a time; every other operand is
reloaded from global memory where it is used, so nothing spills: see the kernel's comment), inverts the four unit-lower diagonal blocks by row substitution
and merges them by block forward substitution (X_ij = -X_ii sum_m A_im X_mj), then writes W, U,
Qg = scale q Gam, Kg = k exp(G_last - G), Aqk (input dtype) and exp(G_last) (fp32, per K).
`gdn_chunk_state` (grid: sequences x value heads x V tiles) walks a sequence's chunks in order
with its state tile in registers, and per chunk runs four dots: V' = U - W h, O = Qg h + Aqk V',
h = h exp(G_last) + Kg^T V'. It needs no gate, norm or exp of its own, so one binary serves GDN
and KDA, and no per-chunk state is written to memory.

KDA stability: exp(G_ic - G_jc) must not be formed as exp(G_i) exp(-G_j) (gates reach -10 a token
and more, so exp(-G_j) overflows within a chunk). Off-diagonal sub-blocks (i > j) split it at
the cumulative gate R before block i: exp(G_i - R) exp(R - G_j), both factors <= 1. Diagonal
blocks form exp(G_ic - G_jc) directly, one column at a time (16 steps of [16, K] work).

Chunk schedule on the device (no host read of lengths): sequence n owns chunk slots
[cu[n] // 64 + n, ... + cdiv(len_n, 64)), so cu[N] // 64 + N slots cover every sequence (the
flattened schedule of prefix_prefill); a prep program finds its sequence by binary search.
"""
import triton
import triton.language as tl

CHUNK = tl.constexpr(64)
SUB = tl.constexpr(16)
L2NORM_EPS = tl.constexpr(1e-6)  # reference.py's l2norm: x / sqrt(sum(x^2) + eps)


@triton.jit
def _sequence_of_slot(Cu, pid, num_seqs):
    """The sequence owning chunk slot `pid`: the last n with cu[n] // 64 + n <= pid."""
    lo = pid * 0
    hi = lo + num_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        first = tl.load(Cu + mid) // CHUNK + mid
        lo = tl.where(first <= pid, mid, lo)
        hi = tl.where(first <= pid, hi, mid - 1)
    return lo


@triton.jit
def _row(x, rows, r):
    """Row r of a [16, D] tile as a [D] vector."""
    return tl.sum(tl.where(rows[:, None] == r, x, 0.0), axis=0)


@triton.jit
def _load_k(K, t0, b, end, hk, s_kt, s_kh, offs_k, qk_l2norm):
    """k of sub-block b (16 tokens) as fp32, normalized if asked; tokens at or past `end` read as
    zeros. Called once per use (an L1/L2 hit after the first), not kept live across the kernel."""
    t = t0 + b * SUB + tl.arange(0, SUB)
    m = t < end
    k = tl.load(K + t.to(tl.int64)[:, None] * s_kt + hk * s_kh + offs_k[None, :], mask=m[:, None],
                other=0.0).to(tl.float32)
    if qk_l2norm != 0:
        k = k / tl.sqrt(tl.sum(k * k, 1) + L2NORM_EPS)[:, None]
    return k


@triton.jit
def _load_g(G, Beta, t0, b, end, hv, s_gt, s_gh, s_bt, s_bh, offs_k, KDA: tl.constexpr):
    """g and beta of sub-block b; past `end` beta = g = 0 (such tokens change nothing)."""
    t = t0 + b * SUB + tl.arange(0, SUB)
    m = t < end
    t = t.to(tl.int64)
    beta = tl.load(Beta + t * s_bt + hv * s_bh, mask=m, other=0.0)
    if KDA:
        g = tl.load(G + t[:, None] * s_gt + hv * s_gh + offs_k[None, :], mask=m[:, None], other=0.0)
    else:
        g = tl.load(G + t * s_gt + hv * s_gh, mask=m, other=0.0)
    return g, beta


@triton.jit
def _load_bv(V, Beta, t0, b, end, hv, s_vt, s_vh, s_bt, s_bh, offs_v):
    """beta v of sub-block b (fp32), read where it is used."""
    t = t0 + b * SUB + tl.arange(0, SUB)
    m = t < end
    t = t.to(tl.int64)
    v = tl.load(V + t[:, None] * s_vt + hv * s_vh + offs_v[None, :], mask=m[:, None], other=0.0).to(tl.float32)
    return v * tl.load(Beta + t * s_bt + hv * s_bh, mask=m, other=0.0)[:, None]


@triton.jit
def _gates(G, Beta, t0, b, end, hv, s_gt, s_gh, s_bt, s_bh, offs_k, R, KDA: tl.constexpr):
    """(cumulative in-chunk log-gate, beta) of sub-block b, given R: the sum of the gates of the
    blocks before it. Recomputed where needed: a KDA gate tile is [16, K] fp32."""
    g, beta = _load_g(G, Beta, t0, b, end, hv, s_gt, s_gh, s_bt, s_bh, offs_k, KDA)
    if KDA:
        return tl.cumsum(g, 0) + R[None, :], beta
    else:
        return tl.cumsum(g, 0) + R, beta


@triton.jit
def _k_gated(K, G, Beta, t0, b, end, hv, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k, qk_l2norm, R,
             KDA: tl.constexpr):
    """(k, cumulative gate) of sub-block b, reloaded: the right operand of an off-diagonal pair."""
    k = _load_k(K, t0, b, end, hk, s_kt, s_kh, offs_k, qk_l2norm)
    Gb, _beta = _gates(G, Beta, t0, b, end, hv, s_gt, s_gh, s_bt, s_bh, offs_k, R, KDA)
    return k, Gb


@triton.jit
def _bk(K, G, Beta, t0, b, end, hv, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k, qk_l2norm, R,
        KDA: tl.constexpr):
    """beta k exp(G) of sub-block b (W's right-hand side), reloaded for each use."""
    k = _load_k(K, t0, b, end, hk, s_kt, s_kh, offs_k, qk_l2norm)
    Gb, beta = _gates(G, Beta, t0, b, end, hv, s_gt, s_gh, s_bt, s_bh, offs_k, R, KDA)
    return k * _gate(Gb, KDA) * beta[:, None]


@triton.jit
def _store_qg_kg(Qg, Kg, q, k, Gb, RL, scale, t0, b, end, hv, HV, HEAD_K: tl.constexpr, KDA: tl.constexpr):
    """Qg = scale q exp(G) and Kg = k exp(G_last - G) rows of sub-block b (exponents <= 0)."""
    _store_rows(Qg, q * _gate(Gb, KDA) * scale, t0, b, end, hv, HV, HEAD_K)
    if KDA:
        _store_rows(Kg, k * tl.exp(RL[None, :] - Gb), t0, b, end, hv, HV, HEAD_K)
    else:
        _store_rows(Kg, k * tl.exp(RL - Gb)[:, None], t0, b, end, hv, HV, HEAD_K)


@triton.jit
def _gate(G, KDA: tl.constexpr):
    """exp(G) shaped to scale a [16, K] tile."""
    if KDA:
        return tl.exp(G)
    else:
        return tl.exp(G)[:, None]


@triton.jit
def _pair(qi, ki, Gi, Ri, kj, Gj, beta_i, scale, KDA: tl.constexpr, DT: tl.constexpr):
    """(A_ij, Aqk_ij) for sub-blocks i > j; Ri: the cumulative gate before block i."""
    if KDA:
        right = kj * tl.exp(Ri[None, :] - Gj)  # <= |k|: block j ends at or before R
        left = tl.exp(Gi - Ri[None, :])  # <= 1
        a = tl.dot(ki * left, tl.trans(right))
        aq = tl.dot(qi * left, tl.trans(right))
    else:
        kjd = tl.trans(kj.to(DT))
        decay = tl.exp(Gi[:, None] - Gj[None, :])  # i > j: <= 1
        a = tl.dot(ki.to(DT), kjd) * decay
        aq = tl.dot(qi.to(DT), kjd) * decay
    return a * beta_i[:, None], aq * scale


@triton.jit
def _diag(qi, ki, Gi, beta_i, scale, rows, cols, KDA: tl.constexpr, DT: tl.constexpr):
    """(A_ii, Aqk_ii) of a diagonal sub-block: A strictly lower, Aqk lower with the diagonal."""
    if KDA:
        a = tl.zeros([SUB, SUB], tl.float32)
        aq = tl.zeros([SUB, SUB], tl.float32)
        for c in range(SUB):
            kc = _row(ki, rows, c)
            Gc = _row(Gi, rows, c)
            # exp only where row >= c (there G_r - G_c <= 0): the other half would overflow.
            e = tl.exp(tl.where(rows[:, None] >= c, Gi - Gc[None, :], float("-inf"))) * kc[None, :]
            ak = tl.sum(ki * e, 1)
            aqk = tl.sum(qi * e, 1)
            a = tl.where(cols[None, :] == c, tl.where(rows > c, ak, 0.0)[:, None], a)
            aq = tl.where(cols[None, :] == c, aqk[:, None], aq)
    else:
        lower = rows[:, None] >= cols[None, :]
        decay = tl.exp(tl.where(lower, Gi[:, None] - Gi[None, :], float("-inf")))
        kb = ki.to(DT)
        kt = tl.trans(kb)
        a = tl.where(rows[:, None] > cols[None, :], tl.dot(kb, kt) * decay, 0.0)
        aq = tl.dot(qi.to(DT), kt) * decay
    return a * beta_i[:, None], aq * scale


@triton.jit
def _inverse_unit_lower(a, rows, cols):
    """(I + a)^-1 for a strictly lower [16, 16] a, by row substitution: row r of the inverse is
    e_r - sum_{j<r} a_rj X_j, and rows j < r are final when row r is formed."""
    x = tl.where(rows[:, None] == cols[None, :], 1.0, 0.0)
    for r in range(1, SUB):
        ar = _row(a, rows, r)
        new = tl.where(cols == r, 1.0, 0.0) - tl.sum(ar[:, None] * x, 0)
        x = tl.where(rows[:, None] == r, new[None, :], x)
    return x


@triton.jit
def _mm(a, b):
    # 16x16x16 fp32 products of the block merge: exact fp32 (a few thousand FMAs each).
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _store_rows(Ptr, x, t0, b, end, hv, HV, D: tl.constexpr):
    """Rows of sub-block b into a [T, HV, D] workspace."""
    t = t0 + b * SUB + tl.arange(0, SUB)
    offs = tl.arange(0, D)
    ptrs = Ptr + (t.to(tl.int64)[:, None] * HV + hv) * D + offs[None, :]
    tl.store(ptrs, x.to(Ptr.dtype.element_ty), mask=(t < end)[:, None])


@triton.jit(do_not_specialize=["qk_l2norm", "num_seqs", "num_slots", "HV", "group", "s_gt", "s_gh", "s_bt", "s_bh"],
            do_not_specialize_on_alignment=["Cu_seqlens", "State_indices", "G", "Beta"])
def gdn_chunk_prep(
    Q, K, V, G, Beta, W, U, Qg, Kg, Aqk, Decay, Cu_seqlens, State_indices,
    scale, qk_l2norm, num_seqs, num_slots, HV, group,
    s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_gt, s_gh, s_bt, s_bh,
    HEAD_K: tl.constexpr, HEAD_V: tl.constexpr, KDA: tl.constexpr,
):
    """One chunk of one value head: W, U, Qg, Kg [T, HV, *] and Aqk [T, HV, 64] rows of the chunk
    (input dtype), and Decay[slot, hv, :] = exp(G_last) (fp32). Grid (chunk slots, HV)."""
    pid = tl.program_id(0)
    hv = tl.program_id(1)
    n = _sequence_of_slot(Cu_seqlens, pid, num_seqs)
    start = tl.load(Cu_seqlens + n)
    end = tl.load(Cu_seqlens + n + 1)
    t0 = start + (pid - (start // CHUNK + n)) * CHUNK
    slot = tl.load(State_indices + n)
    if (t0 >= end) | (slot < 0) | (slot >= num_slots):  # nothing to do, or a padded sequence
        return
    hk = (hv // group).to(tl.int64)
    hv64 = hv.to(tl.int64)
    offs_k = tl.arange(0, HEAD_K)
    offs_v = tl.arange(0, HEAD_V)
    rows = tl.arange(0, SUB)
    cols = tl.arange(0, SUB)

    # Live-range budget (the spills of the version that held q0..q3, k0..k3 as [16, K] fp32 tiles
    # at once: REG 255 / STACK 2096 B at K = 128, 4 warps; STACK 14664 B at K = 256, 8 warps;
    # sm90, Triton 3.6): at most one sub-block's q, k, gate (+ one reloaded k_j, G_j) is live;
    # every other operand is reloaded from global memory where it is used (L1/L2 hits: a chunk
    # reads 64 x K x 2 B of k). [16, 16] tiles (A, Aqk, X: 10 each at most) are cheap.
    if KDA:
        R0 = tl.zeros([HEAD_K], tl.float32)
    else:
        R0 = tl.sum(tl.zeros([SUB], tl.float32), 0)
    g, _beta = _load_g(G, Beta, t0, 0, end, hv64, s_gt, s_gh, s_bt, s_bh, offs_k, KDA)
    R1 = R0 + tl.sum(g, 0)
    g, _beta = _load_g(G, Beta, t0, 1, end, hv64, s_gt, s_gh, s_bt, s_bh, offs_k, KDA)
    R2 = R1 + tl.sum(g, 0)
    g, _beta = _load_g(G, Beta, t0, 2, end, hv64, s_gt, s_gh, s_bt, s_bh, offs_k, KDA)
    R3 = R2 + tl.sum(g, 0)
    g, _beta = _load_g(G, Beta, t0, 3, end, hv64, s_gt, s_gh, s_bt, s_bh, offs_k, KDA)
    RL = R3 + tl.sum(g, 0)  # the cumulative gate at the chunk's last token
    if KDA:
        decay = tl.exp(RL)
    else:
        decay = tl.zeros([HEAD_K], tl.float32) + tl.exp(RL)
    tl.store(Decay + (pid.to(tl.int64) * HV + hv64) * HEAD_K + offs_k, decay)

    # Row block by row block: Qg, Kg rows, then A (with beta) and Aqk (with scale) in 16 x 16
    # sub-blocks; Aqk rows go out at once. q of block i is reloaded for each pair (i, j).
    zero = tl.zeros([SUB, SUB], tl.float32)
    q = _load_k(Q, t0, 0, end, hk, s_qt, s_qh, offs_k, qk_l2norm)
    k = _load_k(K, t0, 0, end, hk, s_kt, s_kh, offs_k, qk_l2norm)
    Gi, bi = _gates(G, Beta, t0, 0, end, hv64, s_gt, s_gh, s_bt, s_bh, offs_k, R0, KDA)
    _store_qg_kg(Qg, Kg, q, k, Gi, RL, scale, t0, 0, end, hv64, HV, HEAD_K, KDA)
    a00, q00 = _diag(q, k, Gi, bi, scale, rows, cols, KDA, Q.dtype.element_ty)
    _store_aqk(Aqk, q00, zero, zero, zero, t0, 0, end, hv64, HV)
    q = _load_k(Q, t0, 1, end, hk, s_qt, s_qh, offs_k, qk_l2norm)
    k = _load_k(K, t0, 1, end, hk, s_kt, s_kh, offs_k, qk_l2norm)
    Gi, bi = _gates(G, Beta, t0, 1, end, hv64, s_gt, s_gh, s_bt, s_bh, offs_k, R1, KDA)
    _store_qg_kg(Qg, Kg, q, k, Gi, RL, scale, t0, 1, end, hv64, HV, HEAD_K, KDA)
    a11, q11 = _diag(q, k, Gi, bi, scale, rows, cols, KDA, Q.dtype.element_ty)
    kj, Gj = _k_gated(K, G, Beta, t0, 0, end, hv64, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k, qk_l2norm,
                      R0, KDA)
    a10, q10 = _pair(q, k, Gi, R1, kj, Gj, bi, scale, KDA, Q.dtype.element_ty)
    _store_aqk(Aqk, q10, q11, zero, zero, t0, 1, end, hv64, HV)
    q = _load_k(Q, t0, 2, end, hk, s_qt, s_qh, offs_k, qk_l2norm)
    k = _load_k(K, t0, 2, end, hk, s_kt, s_kh, offs_k, qk_l2norm)
    Gi, bi = _gates(G, Beta, t0, 2, end, hv64, s_gt, s_gh, s_bt, s_bh, offs_k, R2, KDA)
    _store_qg_kg(Qg, Kg, q, k, Gi, RL, scale, t0, 2, end, hv64, HV, HEAD_K, KDA)
    a22, q22 = _diag(q, k, Gi, bi, scale, rows, cols, KDA, Q.dtype.element_ty)
    kj, Gj = _k_gated(K, G, Beta, t0, 0, end, hv64, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k, qk_l2norm,
                      R0, KDA)
    a20, q20 = _pair(q, k, Gi, R2, kj, Gj, bi, scale, KDA, Q.dtype.element_ty)
    kj, Gj = _k_gated(K, G, Beta, t0, 1, end, hv64, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k, qk_l2norm,
                      R1, KDA)
    a21, q21 = _pair(q, k, Gi, R2, kj, Gj, bi, scale, KDA, Q.dtype.element_ty)
    _store_aqk(Aqk, q20, q21, q22, zero, t0, 2, end, hv64, HV)
    q = _load_k(Q, t0, 3, end, hk, s_qt, s_qh, offs_k, qk_l2norm)
    k = _load_k(K, t0, 3, end, hk, s_kt, s_kh, offs_k, qk_l2norm)
    Gi, bi = _gates(G, Beta, t0, 3, end, hv64, s_gt, s_gh, s_bt, s_bh, offs_k, R3, KDA)
    _store_qg_kg(Qg, Kg, q, k, Gi, RL, scale, t0, 3, end, hv64, HV, HEAD_K, KDA)
    a33, q33 = _diag(q, k, Gi, bi, scale, rows, cols, KDA, Q.dtype.element_ty)
    kj, Gj = _k_gated(K, G, Beta, t0, 0, end, hv64, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k, qk_l2norm,
                      R0, KDA)
    a30, q30 = _pair(q, k, Gi, R3, kj, Gj, bi, scale, KDA, Q.dtype.element_ty)
    kj, Gj = _k_gated(K, G, Beta, t0, 1, end, hv64, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k, qk_l2norm,
                      R1, KDA)
    a31, q31 = _pair(q, k, Gi, R3, kj, Gj, bi, scale, KDA, Q.dtype.element_ty)
    kj, Gj = _k_gated(K, G, Beta, t0, 2, end, hv64, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k, qk_l2norm,
                      R2, KDA)
    a32, q32 = _pair(q, k, Gi, R3, kj, Gj, bi, scale, KDA, Q.dtype.element_ty)
    _store_aqk(Aqk, q30, q31, q32, q33, t0, 3, end, hv64, HV)

    # X = (I + A)^-1: diagonal blocks by substitution, then X_ij = -X_ii sum_{m=j}^{i-1} A_im X_mj.
    x00 = _inverse_unit_lower(a00, rows, cols)
    x11 = _inverse_unit_lower(a11, rows, cols)
    x22 = _inverse_unit_lower(a22, rows, cols)
    x33 = _inverse_unit_lower(a33, rows, cols)
    x10 = -_mm(x11, _mm(a10, x00))
    x21 = -_mm(x22, _mm(a21, x11))
    x20 = -_mm(x22, _mm(a20, x00) + _mm(a21, x10))
    x32 = -_mm(x33, _mm(a32, x22))
    x31 = -_mm(x33, _mm(a31, x11) + _mm(a32, x21))
    x30 = -_mm(x33, _mm(a30, x00) + _mm(a31, x10) + _mm(a32, x20))

    # W = X (beta k exp(G)), U = X (beta v), a row block at a time with the right-hand sides
    # reloaded (one [16, K] accumulator and one operand live); fp32 operands (tf32 on tensor
    # cores: bf16/fp16 inputs pass exactly, gated and normalized values round to 10 bits, finer
    # than the stored dtype).
    acc = tl.dot(x00, _bk(K, G, Beta, t0, 0, end, hv64, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k,
                              qk_l2norm, R0, KDA))
    _store_rows(W, acc, t0, 0, end, hv64, HV, HEAD_K)
    acc = tl.dot(x10, _bk(K, G, Beta, t0, 0, end, hv64, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k,
                              qk_l2norm, R0, KDA))
    acc += tl.dot(x11, _bk(K, G, Beta, t0, 1, end, hv64, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k,
                              qk_l2norm, R1, KDA))
    _store_rows(W, acc, t0, 1, end, hv64, HV, HEAD_K)
    acc = tl.dot(x20, _bk(K, G, Beta, t0, 0, end, hv64, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k,
                              qk_l2norm, R0, KDA))
    acc += tl.dot(x21, _bk(K, G, Beta, t0, 1, end, hv64, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k,
                              qk_l2norm, R1, KDA))
    acc += tl.dot(x22, _bk(K, G, Beta, t0, 2, end, hv64, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k,
                              qk_l2norm, R2, KDA))
    _store_rows(W, acc, t0, 2, end, hv64, HV, HEAD_K)
    acc = tl.dot(x30, _bk(K, G, Beta, t0, 0, end, hv64, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k,
                              qk_l2norm, R0, KDA))
    acc += tl.dot(x31, _bk(K, G, Beta, t0, 1, end, hv64, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k,
                              qk_l2norm, R1, KDA))
    acc += tl.dot(x32, _bk(K, G, Beta, t0, 2, end, hv64, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k,
                              qk_l2norm, R2, KDA))
    acc += tl.dot(x33, _bk(K, G, Beta, t0, 3, end, hv64, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k,
                              qk_l2norm, R3, KDA))
    _store_rows(W, acc, t0, 3, end, hv64, HV, HEAD_K)
    acc = tl.dot(x00, _load_bv(V, Beta, t0, 0, end, hv64, s_vt, s_vh, s_bt, s_bh, offs_v))
    _store_rows(U, acc, t0, 0, end, hv64, HV, HEAD_V)
    acc = tl.dot(x10, _load_bv(V, Beta, t0, 0, end, hv64, s_vt, s_vh, s_bt, s_bh, offs_v))
    acc += tl.dot(x11, _load_bv(V, Beta, t0, 1, end, hv64, s_vt, s_vh, s_bt, s_bh, offs_v))
    _store_rows(U, acc, t0, 1, end, hv64, HV, HEAD_V)
    acc = tl.dot(x20, _load_bv(V, Beta, t0, 0, end, hv64, s_vt, s_vh, s_bt, s_bh, offs_v))
    acc += tl.dot(x21, _load_bv(V, Beta, t0, 1, end, hv64, s_vt, s_vh, s_bt, s_bh, offs_v))
    acc += tl.dot(x22, _load_bv(V, Beta, t0, 2, end, hv64, s_vt, s_vh, s_bt, s_bh, offs_v))
    _store_rows(U, acc, t0, 2, end, hv64, HV, HEAD_V)
    acc = tl.dot(x30, _load_bv(V, Beta, t0, 0, end, hv64, s_vt, s_vh, s_bt, s_bh, offs_v))
    acc += tl.dot(x31, _load_bv(V, Beta, t0, 1, end, hv64, s_vt, s_vh, s_bt, s_bh, offs_v))
    acc += tl.dot(x32, _load_bv(V, Beta, t0, 2, end, hv64, s_vt, s_vh, s_bt, s_bh, offs_v))
    acc += tl.dot(x33, _load_bv(V, Beta, t0, 3, end, hv64, s_vt, s_vh, s_bt, s_bh, offs_v))
    _store_rows(U, acc, t0, 3, end, hv64, HV, HEAD_V)


@triton.jit
def _store_aqk(Aqk, c0, c1, c2, c3, t0, b, end, hv, HV):
    t = t0 + b * SUB + tl.arange(0, SUB)
    ptrs = Aqk + (t.to(tl.int64)[:, None] * HV + hv) * CHUNK + tl.arange(0, SUB)[None, :]
    m = (t < end)[:, None]
    dt = Aqk.dtype.element_ty
    tl.store(ptrs, c0.to(dt), mask=m)
    tl.store(ptrs + SUB, c1.to(dt), mask=m)
    tl.store(ptrs + 2 * SUB, c2.to(dt), mask=m)
    tl.store(ptrs + 3 * SUB, c3.to(dt), mask=m)


@triton.jit(do_not_specialize=["num_seqs", "num_slots", "HV", "s_sn", "s_sh", "s_sv", "s_sk"],
            do_not_specialize_on_alignment=["Cu_seqlens", "State_indices"])
def gdn_chunk_state(
    W, U, Qg, Kg, Aqk, Out, State, Decay, Cu_seqlens, State_indices,
    num_seqs, num_slots, HV, s_ot, s_oh, s_sn, s_sh, s_sv, s_sk,
    HEAD_K: tl.constexpr, HEAD_V: tl.constexpr, BV: tl.constexpr,
):
    """The inter-chunk recurrence and the output of one sequence, one value head, BV values.
    Grid (sequences, HV, HEAD_V // BV). The pool is read and written by strides (s_sv, s_sk:
    V-major has s_sk == 1, K-major s_sv == 1), so one binary serves both layouts."""
    n = tl.program_id(0)
    hv = tl.program_id(1).to(tl.int64)
    vt = tl.program_id(2)
    start = tl.load(Cu_seqlens + n)
    end = tl.load(Cu_seqlens + n + 1)
    slot = tl.load(State_indices + n).to(tl.int64)
    offs_k = tl.arange(0, HEAD_K)
    offs_v = vt * BV + tl.arange(0, BV)
    offs_c = tl.arange(0, CHUNK)
    dt = Out.dtype.element_ty
    if (slot < 0) | (slot >= num_slots):  # a padded sequence: zeros out, state untouched
        for t0 in range(start, end, CHUNK):
            t = t0 + offs_c
            tl.store(Out + t.to(tl.int64)[:, None] * s_ot + hv * s_oh + offs_v[None, :],
                     tl.zeros([CHUNK, BV], dt), mask=(t < end)[:, None])
        return
    # h[k, v] = S[v, k]: K along rows so every dot below takes its operands as they are.
    s_ptrs = State + slot * s_sn + hv * s_sh + offs_v[None, :] * s_sv + offs_k[:, None] * s_sk
    h = tl.load(s_ptrs)
    first_slot = start // CHUNK + n
    for c in range(0, tl.cdiv(end - start, CHUNK)):
        t = start + c * CHUNK + offs_c
        m = (t < end)[:, None]
        t = t.to(tl.int64)
        row_k = (t[:, None] * HV + hv) * HEAD_K
        w = tl.load(W + row_k + offs_k[None, :], mask=m, other=0.0)
        u = tl.load(U + (t[:, None] * HV + hv) * HEAD_V + offs_v[None, :], mask=m, other=0.0)
        qg = tl.load(Qg + row_k + offs_k[None, :], mask=m, other=0.0)
        kgt = tl.load(Kg + (t[None, :] * HV + hv) * HEAD_K + offs_k[:, None], mask=(t < end)[None, :], other=0.0)
        aqk = tl.load(Aqk + (t[:, None] * HV + hv) * CHUNK + offs_c[None, :], mask=m, other=0.0)
        decay = tl.load(Decay + ((first_slot + c).to(tl.int64) * HV + hv) * HEAD_K + offs_k)
        hb = h.to(w.dtype)
        vnew = (u.to(tl.float32) - tl.dot(w, hb)).to(w.dtype)
        o = tl.dot(qg, hb) + tl.dot(aqk, vnew)
        tl.store(Out + t[:, None] * s_ot + hv * s_oh + offs_v[None, :], o.to(dt), mask=m)
        h = h * decay[:, None] + tl.dot(kgt, vnew)
    tl.store(s_ptrs, h)
