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

Two kernels for GDN. `gdn_chunk_prep` (grid: chunk slots x value heads, every chunk in parallel)
builds A and Aqk by two [64, K] x [K, 64] dots over the whole chunk (q and k in the input dtype),
inverts I + A by ten [64, 64] products (_inverse_doubling) and writes W = X (beta k Gam),
U = X (beta v) by [64, 64] x [64, 64-column] dots, Kg = k exp(G_last - G), Aqk (input dtype),
exp(G_last) (fp32, per K) and, Gam being a scalar a token, only the query rows' factor
Fq = scale Gam / |q| (fp32 [T, HV]; the state pass reads q and scales its rows of q h: a
[T, HV, K] write and its read back saved). GDN at fp32 in the 256 tile works in 16-row sub-blocks
instead and writes Qg = scale q Gam (chunk_spec.prep_subblocks). Registers and spills of each
version: the kernel's comment. KDA's precompute is three kernels of its own (kda_chunk.py), with
the same outputs (Qg written, Fq = 1).
`gdn_chunk_state` (grid: sequences x value heads x V tiles) walks a sequence's chunks in order
with its state tile in registers, and per chunk runs four dots: V' = U - W h, O = Fq (Qs h) +
Aqk V' (Qs: q or Qg), h = h exp(G_last) + Kg^T V'. It needs no gate, norm or exp of its own, so
one binary serves GDN and KDA, and no per-chunk state is written to memory.

KDA stability: exp(G_ic - G_jc) must not be formed as exp(G_i) exp(-G_j) (gates reach -10 a token
and more, so exp(-G_j) overflows within a chunk): kda_chunk.py splits pairs in different 16-token
blocks at a cumulative gate between them (both factors <= 1) and forms the pairs inside a block
elementwise.

Head sizes and dtypes: HEAD_K / HEAD_V are the tiles (64, 128, 256); the head sizes K_DIM / V_DIM
are runtime ints. Every load of q, k, v, a KDA gate and the pool and every store of the output and
the pool is masked by them, so the padded channels read as zeros and stay zero through W, U, Kg
and the state tile; the workspaces are tile-wide. fp32 inputs keep an fp32 workspace and run their
dots through _dot (tf32x3 on CUDA, exact fp32 elsewhere), never a single tf32 rounding.

Chunk schedule on the device (no host read of lengths): sequence n owns chunk slots
[cu[n] // 64 + n, ... + cdiv(len_n, 64)), so cu[N] // 64 + N slots cover every sequence (the
flattened schedule of prefix_prefill); a prep program finds its sequence by binary search.
"""
import triton
import triton.language as tl

from aotc.kernels.common.schedule import owner_of_block

CHUNK = tl.constexpr(64)
SUB = tl.constexpr(16)
WCOL = tl.constexpr(64)  # columns a W/U dot (see the kernel)
L2NORM_EPS = tl.constexpr(1e-6)  # reference.py's l2norm: x / sqrt(sum(x^2) + eps)


@triton.jit
def _load_k(K, t0, b, end, hk, s_kt, s_kh, offs_k, K_DIM, qk_l2norm):
    """k of sub-block b (16 tokens) as fp32, normalized if asked; tokens at or past `end` read as
    zeros. Called once per use (an L1/L2 hit after the first), not kept live across the kernel."""
    t = t0 + b * SUB + tl.arange(0, SUB)
    m = t < end
    k = tl.load(K + t.to(tl.int64)[:, None] * s_kt + hk * s_kh + offs_k[None, :],
                mask=m[:, None] & (offs_k < K_DIM)[None, :], other=0.0).to(tl.float32)
    if qk_l2norm != 0:
        k = k / tl.sqrt(tl.sum(k * k, 1) + L2NORM_EPS)[:, None]
    return k


@triton.jit
def _load_g(G, Beta, t0, b, end, hv, s_gt, s_gh, s_bt, s_bh):
    """g and beta of sub-block b (GDN); past `end` beta = g = 0 (such tokens change nothing)."""
    t = t0 + b * SUB + tl.arange(0, SUB)
    m = t < end
    t = t.to(tl.int64)
    beta = tl.load(Beta + t * s_bt + hv * s_bh, mask=m, other=0.0)
    g = tl.load(G + t * s_gt + hv * s_gh, mask=m, other=0.0)
    return g, beta


@triton.jit
def _gates(G, Beta, t0, b, end, hv, s_gt, s_gh, s_bt, s_bh, R):
    """(cumulative in-chunk log-gate, beta) of sub-block b, given R: the sum of the gates of the
    blocks before it."""
    g, beta = _load_g(G, Beta, t0, b, end, hv, s_gt, s_gh, s_bt, s_bh)
    return tl.cumsum(g, 0) + R, beta


@triton.jit
def _k_gated(K, G, Beta, t0, b, end, hv, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k, K_DIM, qk_l2norm, R):
    """(k, cumulative gate) of sub-block b, reloaded: the right operand of an off-diagonal pair."""
    k = _load_k(K, t0, b, end, hk, s_kt, s_kh, offs_k, K_DIM, qk_l2norm)
    Gb, _beta = _gates(G, Beta, t0, b, end, hv, s_gt, s_gh, s_bt, s_bh, R)
    return k, Gb


@triton.jit
def _store_qg_kg(Qg, Kg, q, k, Gb, RL, scale, t0, b, end, hv, HV, HEAD_K: tl.constexpr):
    """Qg = scale q exp(G) and Kg = k exp(G_last - G) rows of sub-block b (exponents <= 0)."""
    _store_rows(Qg, q * tl.exp(Gb)[:, None] * scale, t0, b, end, hv, HV, HEAD_K)
    _store_rows(Kg, k * tl.exp(RL - Gb)[:, None], t0, b, end, hv, HV, HEAD_K)


@triton.jit
def _pair(qi, ki, Gi, kj, Gj, beta_i, scale, DT: tl.constexpr, TF32: tl.constexpr):
    """(A_ij, Aqk_ij) for sub-blocks i > j (GDN: a scalar gate a token, exp(G_i - G_j) <= 1)."""
    kjd = tl.trans(kj.to(DT))
    decay = tl.exp(Gi[:, None] - Gj[None, :])
    a = _dot(ki.to(DT), kjd, TF32) * decay
    aq = _dot(qi.to(DT), kjd, TF32) * decay
    return a * beta_i[:, None], aq * scale


@triton.jit
def _diag(qi, ki, Gi, beta_i, scale, rows, cols, DT: tl.constexpr, TF32: tl.constexpr):
    """(A_ii, Aqk_ii) of a diagonal sub-block: A strictly lower, Aqk lower with the diagonal."""
    lower = rows[:, None] >= cols[None, :]
    decay = tl.exp(tl.where(lower, Gi[:, None] - Gi[None, :], float("-inf")))
    kb = ki.to(DT)
    kt = tl.trans(kb)
    a = tl.where(rows[:, None] > cols[None, :], _dot(kb, kt, TF32) * decay, 0.0)
    aq = _dot(qi.to(DT), kt, TF32) * decay
    return a * beta_i[:, None], aq * scale


@triton.jit
def _inverse_diagonal(a00, a11, a22, a33):
    """(I + a_bb)^-1 of the four strictly lower [16, 16] diagonal blocks, stacked [4, 16, 16] and
    solved together by row substitution (15 steps, not 4 x 15): row r of an inverse is
    e_r - sum_{j<r} a_rj X_j, and rows j < r are final when row r is formed."""
    b = tl.arange(0, 4)[:, None, None]
    rows = tl.arange(0, SUB)[None, :, None]
    cols = tl.arange(0, SUB)[None, None, :]
    a = tl.where(b == 0, a00[None, :, :], tl.where(b == 1, a11[None, :, :],
                 tl.where(b == 2, a22[None, :, :], a33[None, :, :])))
    x = tl.where(rows == cols, 1.0, 0.0) + tl.zeros([4, SUB, SUB], tl.float32)
    for r in range(1, SUB):
        ar = tl.sum(tl.where(rows == r, a, 0.0), 1)  # [4, 16]: row r of each block
        new = tl.where(cols == r, 1.0, 0.0) - tl.sum(ar[:, :, None] * x, 1)[:, None, :]
        x = tl.where(rows == r, new, x)
    return (tl.sum(tl.where(b == 0, x, 0.0), 0), tl.sum(tl.where(b == 1, x, 0.0), 0),
            tl.sum(tl.where(b == 2, x, 0.0), 0), tl.sum(tl.where(b == 3, x, 0.0), 0))


@triton.jit
def _inverse_doubling(a, TF: tl.constexpr, EXACT: tl.constexpr, BF16: tl.constexpr = False):
    """X = (I + A)^-1 of the strictly lower A [64, 64] by [64, 64] products alone. D = I + A's
    diagonal 16 x 16 blocks Ad: D^-1 = (I - Ad)(I + Ad^2)(I + Ad^4)(I + Ad^8) (Ad^16 = 0); with the
    rest L, N = D^-1 L is strictly block lower (N^4 = 0), so X = (I + N)^-1 D^-1 = (I - N)(I + N^2) D^-1.
    Ten products, no 16 x 16 tiles cut out or put back.
    Each factor is used as soon as it exists, so no more than three [64, 64] tiles are live (fewer
    spilled registers at the 168 cap), and I +- M is formed as a select on the diagonal (every M
    here is strictly lower: the same values, no identity tile kept). BF16: the products on bf16
    operands (_mm)."""
    r = tl.arange(0, CHUNK)
    same = (r[:, None] // SUB) == (r[None, :] // SUB)
    diag = r[:, None] == r[None, :]
    ad = tl.where(same, a, 0.0)
    low = tl.where(same, 0.0, a)
    p2 = _mm(ad, ad, TF, EXACT, BF16)
    d = _mm(tl.where(diag, 1.0, -ad), tl.where(diag, 1.0, p2), TF, EXACT, BF16)
    p4 = _mm(p2, p2, TF, EXACT, BF16)
    d = _mm(d, tl.where(diag, 1.0, p4), TF, EXACT, BF16)
    p8 = _mm(p4, p4, TF, EXACT, BF16)
    dinv = _mm(d, tl.where(diag, 1.0, p8), TF, EXACT, BF16)
    n = _mm(dinv, low, TF, EXACT, BF16)
    y = _mm(tl.where(diag, 1.0, -n), tl.where(diag, 1.0, _mm(n, n, TF, EXACT, BF16)), TF, EXACT, BF16)
    return _mm(y, dinv, TF, EXACT, BF16)


@triton.jit
def _dot(a, b, TF32: tl.constexpr):
    """a @ b, fp32 accumulate. fp32 operands from fp32 inputs: tf32x3 on CUDA (three tf32 products,
    about fp32's precision, on tensor cores), exact FMAs elsewhere, never one tf32 rounding (that
    would be an fp16-sized error in an fp32 call). 16-bit operands: as they are."""
    if a.dtype == tl.float32:
        if TF32:
            return tl.dot(a, b, input_precision="tf32x3")
        else:
            return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _mm(a, b, TF32: tl.constexpr, EXACT: tl.constexpr, BF16: tl.constexpr = False):
    # Products of the inverse and the W/U dots, fp32 accumulate. TF32 (CUDA targets,
    # chunk_spec.prep_target_constexprs): on tensor cores in tf32 (flash-linear-attention's
    # solve_tril offers it); X then enters the W/U dots as bf16 (bf16 inputs) or tf32 (fp16), both
    # coarser. BF16 (gdn_chunk_prep, bf16 inputs on CUDA): the inverse's products on bf16 operands,
    # twice tf32's tensor rate at half its shared-memory bytes, fp32's range (fp16's would overflow
    # where X grows past 65504); X is rounded to bf16 for the W/U dots anyway (BENCHMARKS.md,
    # Kernel choices: bf16 inverse). Exact fp32 FMAs ("ieee")
    # elsewhere; EXACT (fp32 inputs): _dot's fp32 precision instead.
    if EXACT:
        return _dot(a, b, TF32)
    elif BF16:
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    elif TF32:
        return tl.dot(a, b, input_precision="tf32")
    else:
        return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _wy_operand(x, DT: tl.constexpr):
    """An operand of the W/U dots: bf16 for bf16 inputs (as flash-linear-attention's recompute_w_u
    does), else fp32 (tf32 on tensor cores: fp16 would overflow where X grows past 65504)."""
    if DT == tl.bfloat16:
        return x.to(tl.bfloat16)
    else:
        return x


@triton.jit
def _store_rows(Ptr, x, t0, b, end, hv, HV, D: tl.constexpr):
    """Rows of sub-block b into a [T, HV, D] workspace."""
    t = t0 + b * SUB + tl.arange(0, SUB)
    offs = tl.arange(0, D)
    ptrs = Ptr + (t.to(tl.int64)[:, None] * HV + hv) * D + offs[None, :]
    tl.store(ptrs, x.to(Ptr.dtype.element_ty), mask=(t < end)[:, None])


@triton.jit
def _chunk_cols(P, t, m, s_t, off, c0, D, FP32: tl.constexpr = True):
    """Columns [c0, c0 + WCOL) of a chunk's rows t (int64) as fp32 (else in P's dtype); rows past the
    end and columns past D (the true head size) read as zeros."""
    c = c0 + tl.arange(0, WCOL)
    mask = m[:, None] & (c < D)[None, :]
    x = tl.load(P + t[:, None] * s_t + off + c[None, :], mask=mask, other=0.0)
    if FP32:
        x = x.to(tl.float32)
    return x


@triton.jit
def _store_cols(P, x, t, m, hv, HV, c0, D: tl.constexpr):
    """Columns [c0, c0 + WCOL) of a chunk's rows into a [T, HV, D] workspace."""
    c = c0 + tl.arange(0, WCOL)
    tl.store(P + (t[:, None] * HV + hv) * D + c[None, :], x.to(P.dtype.element_ty), mask=m[:, None] & (c < D)[None, :])


@triton.jit
def _wy_dots(W, U, xw, Kr, s_kr, k_off, rs, V, s_vt, v_off, Beta, s_bt, s_bh, t, m, hv64, HV, K_DIM, V_DIM,
             HEAD_K: tl.constexpr, HEAD_V: tl.constexpr, TF: tl.constexpr, EXACT: tl.constexpr,
             ROW_SCALE: tl.constexpr):
    """W = X (k's rows, times rs when ROW_SCALE) and U = X (beta v) of a chunk, in [64, WCOL] column
    blocks; xw: X as the dots' operand, k's rows at Kr + t * s_kr + k_off, v's at V + t * s_vt + v_off.
    16-bit inputs with at most two blocks a side: every block issued before the first dot, one
    exposed load latency instead of one a block, as a store between them kept each next load behind
    it (BENCHMARKS.md, Kernel choices: bf16 inverse); not at fp32 (spills more at
    the 128 tile) nor past two blocks a side (registers)."""
    DTW: tl.constexpr = W.dtype.element_ty
    if HEAD_K <= 2 * WCOL and HEAD_V <= 2 * WCOL and not EXACT:
        kc0 = _chunk_cols(Kr, t, m, s_kr, k_off, 0, K_DIM, False)
        vc0 = _chunk_cols(V, t, m, s_vt, v_off, 0, V_DIM, False)
        if HEAD_K > WCOL:
            kc1 = _chunk_cols(Kr, t, m, s_kr, k_off, WCOL, K_DIM, False)
        if HEAD_V > WCOL:
            vc1 = _chunk_cols(V, t, m, s_vt, v_off, WCOL, V_DIM, False)
        bv = tl.load(Beta + t * s_bt + hv64 * s_bh, mask=m, other=0.0)
        _store_cols(W, _mm(xw, _wy_operand(_row_scaled(kc0.to(tl.float32), rs, ROW_SCALE), DTW), TF, EXACT), t, m,
                    hv64, HV, 0, HEAD_K)
        if HEAD_K > WCOL:
            _store_cols(W, _mm(xw, _wy_operand(_row_scaled(kc1.to(tl.float32), rs, ROW_SCALE), DTW), TF, EXACT), t,
                        m, hv64, HV, WCOL, HEAD_K)
        _store_cols(U, _mm(xw, _wy_operand(vc0.to(tl.float32) * bv[:, None], DTW), TF, EXACT), t, m, hv64, HV, 0,
                    HEAD_V)
        if HEAD_V > WCOL:
            _store_cols(U, _mm(xw, _wy_operand(vc1.to(tl.float32) * bv[:, None], DTW), TF, EXACT), t, m, hv64, HV,
                        WCOL, HEAD_V)
    else:
        for c0 in tl.static_range(0, HEAD_K, WCOL):
            kc = _row_scaled(_chunk_cols(Kr, t, m, s_kr, k_off, c0, K_DIM), rs, ROW_SCALE)
            _store_cols(W, _mm(xw, _wy_operand(kc, DTW), TF, EXACT), t, m, hv64, HV, c0, HEAD_K)
        bv = tl.load(Beta + t * s_bt + hv64 * s_bh, mask=m, other=0.0)
        for c0 in tl.static_range(0, HEAD_V, WCOL):
            vc = _chunk_cols(V, t, m, s_vt, v_off, c0, V_DIM) * bv[:, None]
            _store_cols(U, _mm(xw, _wy_operand(vc, DTW), TF, EXACT), t, m, hv64, HV, c0, HEAD_V)


@triton.jit
def _row_scaled(x, rs, ROW_SCALE: tl.constexpr):
    if ROW_SCALE:
        return x * rs[:, None]
    else:
        return x


@triton.jit
def _block_of(a4, i: tl.constexpr, j: tl.constexpr):
    """Block (i, j) [16, 16] of a [64, 64] tile viewed as [4, 16, 4, 16]."""
    b = tl.arange(0, 4)
    sel = (b[:, None, None, None] == i) & (b[None, None, :, None] == j)
    return tl.sum(tl.sum(tl.where(sel, a4, 0.0), 2), 0)


@triton.jit
def _put(x4, blk, i: tl.constexpr, j: tl.constexpr):
    b = tl.arange(0, 4)
    sel = (b[:, None, None, None] == i) & (b[None, None, :, None] == j)
    return tl.where(sel, blk[None, :, None, :], x4)


@triton.jit
def _assemble(x00, x11, x22, x33, x10, x20, x21, x30, x31, x32):
    """The unit-lower [64, 64] X from its ten 16 x 16 blocks (zeros above)."""
    x4 = tl.zeros([4, SUB, 4, SUB], tl.float32)
    x4 = _put(x4, x00, 0, 0)
    x4 = _put(x4, x11, 1, 1)
    x4 = _put(x4, x22, 2, 2)
    x4 = _put(x4, x33, 3, 3)
    x4 = _put(x4, x10, 1, 0)
    x4 = _put(x4, x20, 2, 0)
    x4 = _put(x4, x21, 2, 1)
    x4 = _put(x4, x30, 3, 0)
    x4 = _put(x4, x31, 3, 1)
    x4 = _put(x4, x32, 3, 2)
    return tl.reshape(x4, [CHUNK, CHUNK])


@triton.jit
def _gdn_chunk_a(q_in, k_in, g, beta, Fq, Kg, Aqk, t, m, hv, HV, qk_l2norm, scale, RL,
                 HEAD_K: tl.constexpr, TF32: tl.constexpr):
    """GDN, whole chunk, from its q, k rows (input dtype), gates and beta: writes Fq (q's row
    factor, see gdn_chunk_prep), Kg, Aqk rows; returns A [64, 64] (strictly lower, with beta) and
    k's row factor for W (beta exp(G) / |k|).
    A scalar gate per token makes exp(G_r - G_c) (r >= c, <= 1) safe chunk-wide; q and k enter the
    dots in the input dtype (fp32 accumulate; bf16 rounds normalized values to 8 bits, as fla does)."""
    offs_k = tl.arange(0, HEAD_K)
    Gc = tl.cumsum(g, 0)
    rows = (t[:, None] * HV + hv) * HEAD_K + offs_k[None, :]
    dt = q_in.dtype
    # q, then k: each goes to the input dtype once used, so no two [64, K] fp32 tiles are live.
    q = q_in.to(tl.float32)
    fq = tl.exp(Gc) * scale
    if qk_l2norm != 0:
        rq = 1.0 / tl.sqrt(tl.sum(q * q, 1) + L2NORM_EPS)
        q = q * rq[:, None]
        fq = fq * rq
    tl.store(Fq + t * HV + hv, fq, mask=m)
    qb = q.to(dt)
    k = k_in.to(tl.float32)
    fk = beta * tl.exp(Gc)  # G <= 0
    if qk_l2norm != 0:
        rk = 1.0 / tl.sqrt(tl.sum(k * k, 1) + L2NORM_EPS)
        k = k * rk[:, None]
        fk = fk * rk
    tl.store(Kg + rows, (k * tl.exp(RL - Gc)[:, None]).to(Kg.dtype.element_ty), mask=m[:, None])
    kb = k.to(dt)
    kt = tl.trans(kb)
    r = tl.arange(0, CHUNK)
    # The decay tile is formed again for A rather than kept live across the second dot (registers).
    aq = _dot(qb, kt, TF32) * _pair_decay(Gc, r) * scale
    tl.store(Aqk + (t[:, None] * HV + hv) * CHUNK + r[None, :], aq.to(Aqk.dtype.element_ty), mask=m[:, None])
    a = tl.where(r[:, None] > r[None, :], _dot(kb, kt, TF32) * _pair_decay(Gc, r), 0.0) * beta[:, None]
    return a, fk


@triton.jit
def _pair_decay(Gc, r):
    """exp(G_r - G_c) for r >= c, else 0 (GDN: a scalar cumulative gate a token, <= 1)."""
    return tl.exp(tl.where(r[:, None] >= r[None, :], Gc[:, None] - Gc[None, :], float("-inf")))



@triton.jit
def _dot_acc(a, b, acc, TF32: tl.constexpr):
    """acc + a @ b, as _dot (the accumulator stays in the MMA's registers)."""
    if a.dtype == tl.float32:
        if TF32:
            return tl.dot(a, b, acc, input_precision="tf32x3")
        else:
            return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit(do_not_specialize=["qk_l2norm", "num_seqs", "num_slots", "HV", "group", "s_gt", "s_gh", "s_bt", "s_bh"],
            do_not_specialize_on_alignment=["Cu_seqlens", "State_indices", "G", "Beta"])
def gdn_chunk_prep(
    Q, K, V, G, Beta, W, U, Qg, Fq, Kg, Aqk, Decay, Cu_seqlens, State_indices,
    scale, qk_l2norm, num_seqs, num_slots, HV, group, K_DIM, V_DIM,
    s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_gt, s_gh, s_bt, s_bh,
    HEAD_K: tl.constexpr, HEAD_V: tl.constexpr, SUBBLOCKS: tl.constexpr,
    MERGE_TF32: tl.constexpr,
):
    """One chunk of one value head: W, U, Kg [T, HV, *] and Aqk [T, HV, 64] rows of the chunk
    (input dtype), Decay[slot, hv, :] = exp(G_last) (fp32) and the state pass's query rows: GDN
    (a scalar gate a token) writes only their factor Fq [T, HV] = scale exp(G) / |q| (fp32; the
    state pass scales q h's rows by it and reads q itself); in 16-row sub-blocks (SUBBLOCKS) it
    writes Qg = scale q exp(G) and Fq = 1 instead. Grid (chunk slots x HV,): program i is chunk slot i // HV, value head i % HV."""
    # Value heads vary fastest: the programs of one chunk run side by side, so q and k rows shared by
    # a GVA group come from L2 and the workspace rows they write are contiguous
    # (BENCHMARKS.md, Kernel choices: precompute grid and loads).
    pid = tl.program_id(0) // HV
    hv = tl.program_id(0) % HV
    n = owner_of_block(Cu_seqlens, pid, num_seqs, CHUNK)  # the sequence owning chunk slot pid
    start = tl.load(Cu_seqlens + n)
    end = tl.load(Cu_seqlens + n + 1)
    t0 = start + (pid - (start // CHUNK + n)) * CHUNK
    slot = tl.load(State_indices + n)
    if (t0 >= end) | (slot < 0) | (slot >= num_slots):  # nothing to do, or a padded sequence
        return
    hk = (hv // group).to(tl.int64)
    hv64 = hv.to(tl.int64)
    offs_k = tl.arange(0, HEAD_K)
    rows = tl.arange(0, SUB)
    cols = tl.arange(0, SUB)

    # Registers / spill stack per thread (sm90, Triton 3.6, bf16, cuobjdump -res-usage):
    #   version                               K=128 gdn 4w  K=128 kda 4w  K=256 gdn 8w  K=256 kda 8w
    #   q0..q3, k0..k3 [16, K] fp32 all live   255 / 2096    96 / 3792    32 / 14664   (not run)
    #   one row block live, rest reloaded      255 / 208    255 / 552    255 / 824    128 / 1848
    #   + sub-block dots in the input dtype    255 / 8          -        255 / 160        -
    #   GDN chunk-wide A dots, X [64, 64] and
    #   W/U in 64-column dots                  255 / 112    255 / 112    214 / 0      255 / 304
    #   + the four diagonal inverses as one
    #   [4, 16, 16] solve                      250 / 0      255 / 120    221 / 0      255 / 272
    # That version also: K = 128 gdn 8 warps 170 / 0; K = 64 gdn 4 warps 252 / 0; sm80 K = 128
    # 4 warps gdn 255 / 48, kda 255 / 152. Since: GDN capped at 168 registers (prep_launch), W/U on
    # bf16 operands, Fq in place of Qg, tf32 merges (this version): K = 128 gdn 168 / 30 bytes of
    # spills at 4 warps (the H100's JIT report; 68 with the merges in exact fp32).
    # Small [16, *] dots cost registers in every warp: Triton's MMA repeats a 16-row tile per warp.
    # GDN with X by [64, 64] products (_inverse_doubling): 168 / 60 at the cap, 233 / 0 without it
    # (H100 JIT report, K = 128, 4 warps); with its factors used as formed and q, k loaded up front:
    # 168 / 24 at the cap, 205 / 0 without it (cuobjdump here: stack 240 -> 96 bytes).
    # With the inverse on bf16 operands and W/U's loads issued together (bf16 inputs): 168 / 38 at the
    # cap (H100 JIT report, K = 128, 4 warps).
    t = t0 + tl.arange(0, CHUNK)
    m = t < end
    t = t.to(tl.int64)
    TF: tl.constexpr = MERGE_TF32
    EXACT: tl.constexpr = Q.dtype.element_ty == tl.float32
    BFM: tl.constexpr = (MERGE_TF32 != 0) and (Q.dtype.element_ty == tl.bfloat16)  # _mm's BF16
    if SUBBLOCKS:
        R0 = tl.sum(tl.zeros([SUB], tl.float32), 0)
        g, _beta = _load_g(G, Beta, t0, 0, end, hv64, s_gt, s_gh, s_bt, s_bh)
        R1 = R0 + tl.sum(g, 0)
        g, _beta = _load_g(G, Beta, t0, 1, end, hv64, s_gt, s_gh, s_bt, s_bh)
        R2 = R1 + tl.sum(g, 0)
        g, _beta = _load_g(G, Beta, t0, 2, end, hv64, s_gt, s_gh, s_bt, s_bh)
        R3 = R2 + tl.sum(g, 0)
        g, _beta = _load_g(G, Beta, t0, 3, end, hv64, s_gt, s_gh, s_bt, s_bh)
        RL = R3 + tl.sum(g, 0)  # the cumulative gate at the chunk's last token
        decay = tl.zeros([HEAD_K], tl.float32) + tl.exp(RL)
        tl.store(Decay + (pid.to(tl.int64) * HV + hv64) * HEAD_K + offs_k, decay)
        # GDN where the chunk-wide dots' fp32 tiles would not fit in shared memory
        # (chunk_spec.prep_subblocks). Row block by row block: Qg, Kg rows, then A (with beta) and
        # Aqk (with scale) in 16 x 16 sub-blocks; Aqk rows go out at once. Block i holds its q, k,
        # gate; k_j, G_j are reloaded.
        zero = tl.zeros([SUB, SUB], tl.float32)
        q = _load_k(Q, t0, 0, end, hk, s_qt, s_qh, offs_k, K_DIM, qk_l2norm)
        k = _load_k(K, t0, 0, end, hk, s_kt, s_kh, offs_k, K_DIM, qk_l2norm)
        Gi, bi = _gates(G, Beta, t0, 0, end, hv64, s_gt, s_gh, s_bt, s_bh, R0)
        _store_qg_kg(Qg, Kg, q, k, Gi, RL, scale, t0, 0, end, hv64, HV, HEAD_K)
        tq = t0 + tl.arange(0, CHUNK)
        tl.store(Fq + tq.to(tl.int64) * HV + hv64, tl.full([CHUNK], 1.0, tl.float32), mask=tq < end)
        a00, q00 = _diag(q, k, Gi, bi, scale, rows, cols, Q.dtype.element_ty, MERGE_TF32)
        _store_aqk(Aqk, q00, zero, zero, zero, t0, 0, end, hv64, HV)
        q = _load_k(Q, t0, 1, end, hk, s_qt, s_qh, offs_k, K_DIM, qk_l2norm)
        k = _load_k(K, t0, 1, end, hk, s_kt, s_kh, offs_k, K_DIM, qk_l2norm)
        Gi, bi = _gates(G, Beta, t0, 1, end, hv64, s_gt, s_gh, s_bt, s_bh, R1)
        _store_qg_kg(Qg, Kg, q, k, Gi, RL, scale, t0, 1, end, hv64, HV, HEAD_K)
        a11, q11 = _diag(q, k, Gi, bi, scale, rows, cols, Q.dtype.element_ty, MERGE_TF32)
        kj, Gj = _k_gated(K, G, Beta, t0, 0, end, hv64, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k,
                          K_DIM, qk_l2norm, R0)
        a10, q10 = _pair(q, k, Gi, kj, Gj, bi, scale, Q.dtype.element_ty, MERGE_TF32)
        _store_aqk(Aqk, q10, q11, zero, zero, t0, 1, end, hv64, HV)
        q = _load_k(Q, t0, 2, end, hk, s_qt, s_qh, offs_k, K_DIM, qk_l2norm)
        k = _load_k(K, t0, 2, end, hk, s_kt, s_kh, offs_k, K_DIM, qk_l2norm)
        Gi, bi = _gates(G, Beta, t0, 2, end, hv64, s_gt, s_gh, s_bt, s_bh, R2)
        _store_qg_kg(Qg, Kg, q, k, Gi, RL, scale, t0, 2, end, hv64, HV, HEAD_K)
        a22, q22 = _diag(q, k, Gi, bi, scale, rows, cols, Q.dtype.element_ty, MERGE_TF32)
        kj, Gj = _k_gated(K, G, Beta, t0, 0, end, hv64, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k,
                          K_DIM, qk_l2norm, R0)
        a20, q20 = _pair(q, k, Gi, kj, Gj, bi, scale, Q.dtype.element_ty, MERGE_TF32)
        kj, Gj = _k_gated(K, G, Beta, t0, 1, end, hv64, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k,
                          K_DIM, qk_l2norm, R1)
        a21, q21 = _pair(q, k, Gi, kj, Gj, bi, scale, Q.dtype.element_ty, MERGE_TF32)
        _store_aqk(Aqk, q20, q21, q22, zero, t0, 2, end, hv64, HV)
        q = _load_k(Q, t0, 3, end, hk, s_qt, s_qh, offs_k, K_DIM, qk_l2norm)
        k = _load_k(K, t0, 3, end, hk, s_kt, s_kh, offs_k, K_DIM, qk_l2norm)
        Gi, bi = _gates(G, Beta, t0, 3, end, hv64, s_gt, s_gh, s_bt, s_bh, R3)
        _store_qg_kg(Qg, Kg, q, k, Gi, RL, scale, t0, 3, end, hv64, HV, HEAD_K)
        a33, q33 = _diag(q, k, Gi, bi, scale, rows, cols, Q.dtype.element_ty, MERGE_TF32)
        kj, Gj = _k_gated(K, G, Beta, t0, 0, end, hv64, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k,
                          K_DIM, qk_l2norm, R0)
        a30, q30 = _pair(q, k, Gi, kj, Gj, bi, scale, Q.dtype.element_ty, MERGE_TF32)
        kj, Gj = _k_gated(K, G, Beta, t0, 1, end, hv64, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k,
                          K_DIM, qk_l2norm, R1)
        a31, q31 = _pair(q, k, Gi, kj, Gj, bi, scale, Q.dtype.element_ty, MERGE_TF32)
        kj, Gj = _k_gated(K, G, Beta, t0, 2, end, hv64, hk, s_kt, s_kh, s_gt, s_gh, s_bt, s_bh, offs_k,
                          K_DIM, qk_l2norm, R2)
        a32, q32 = _pair(q, k, Gi, kj, Gj, bi, scale, Q.dtype.element_ty, MERGE_TF32)
        _store_aqk(Aqk, q30, q31, q32, q33, t0, 3, end, hv64, HV)

        # X = (I + A)^-1: diagonal blocks by substitution, then X_ij = -X_ii sum_{m=j}^{i-1} A_im X_mj.
        x00, x11, x22, x33 = _inverse_diagonal(a00, a11, a22, a33)
        x10 = -_mm(x11, _mm(a10, x00, TF, EXACT), TF, EXACT)
        x21 = -_mm(x22, _mm(a21, x11, TF, EXACT), TF, EXACT)
        x20 = -_mm(x22, _mm(a20, x00, TF, EXACT) + _mm(a21, x10, TF, EXACT), TF, EXACT)
        x32 = -_mm(x33, _mm(a32, x22, TF, EXACT), TF, EXACT)
        x31 = -_mm(x33, _mm(a31, x11, TF, EXACT) + _mm(a32, x21, TF, EXACT), TF, EXACT)
        x30 = -_mm(x33, _mm(a30, x00, TF, EXACT) + _mm(a31, x10, TF, EXACT) + _mm(a32, x20, TF, EXACT), TF, EXACT)
        x = _assemble(x00, x11, x22, x33, x10, x20, x21, x30, x31, x32)
    else:
        # GDN: A and Aqk of the whole chunk as two [64, K] x [K, 64] dots (64 rows: the four
        # warps share the rows instead of each repeating a 16-row tile), X by [64, 64] products
        # (_inverse_doubling: no 16 x 16 tiles cut out and put back; BENCHMARKS.md, Kernel
        # choices: inverse by products).
        # q, k, gates and beta issued before the first store and dot, so their latencies overlap (v
        # stays below the inverse: live across it, it spills; BENCHMARKS.md, Kernel choices:
        # precompute grid and loads).
        km = m[:, None] & (offs_k < K_DIM)[None, :]
        g = tl.load(G + t * s_gt + hv64 * s_gh, mask=m, other=0.0)
        beta = tl.load(Beta + t * s_bt + hv64 * s_bh, mask=m, other=0.0)
        q_in = tl.load(Q + t[:, None] * s_qt + hk * s_qh + offs_k[None, :], mask=km, other=0.0)
        k_in = tl.load(K + t[:, None] * s_kt + hk * s_kh + offs_k[None, :], mask=km, other=0.0)
        RL = tl.sum(g, 0)  # the gate at the last token
        tl.store(Decay + (pid.to(tl.int64) * HV + hv64) * HEAD_K + offs_k, tl.zeros([HEAD_K], tl.float32) + tl.exp(RL))
        a, fk = _gdn_chunk_a(q_in, k_in, g, beta, Fq, Kg, Aqk, t, m, hv64, HV, qk_l2norm, scale, RL, HEAD_K,
                             MERGE_TF32)
        x = _inverse_doubling(a, TF, EXACT, BFM)

    # W = X (beta k exp(G)), U = X (beta v): X [64, 64], one [64, 64] x [64, K] dot
    # each with the chunk's right-hand side. bf16 inputs: bf16 operands (_wy_operand: faster; W and
    # U move by their own bf16 rounding; BENCHMARKS.md, Kernel choices: bf16 W/U operands). fp16
    # inputs: fp32 operands (tf32 on tensor cores; fp16 X could overflow).
    xw = _wy_operand(x, W.dtype.element_ty)
    # In column blocks of WCOL (one [64, WCOL] fp32 operand and result live, not [64, K]).
    if SUBBLOCKS:  # the per-row factor of k: beta exp(G) / |k| (else _gdn_chunk_a's)
        rs = tl.load(Beta + t * s_bt + hv64 * s_bh, mask=m, other=0.0)
        rs = rs * tl.exp(tl.cumsum(tl.load(G + t * s_gt + hv64 * s_gh, mask=m, other=0.0), 0))
        if qk_l2norm != 0:
            ss = tl.zeros([CHUNK], tl.float32)
            for c0 in tl.static_range(0, HEAD_K, WCOL):
                kc = _chunk_cols(K, t, m, s_kt, hk * s_kh, c0, K_DIM)
                ss += tl.sum(kc * kc, 1)
            rs = rs / tl.sqrt(ss + L2NORM_EPS)
    else:
        rs = fk
    _wy_dots(W, U, xw, K, s_kt, hk * s_kh, rs, V, s_vt, hv64 * s_vh, Beta, s_bt, s_bh, t, m, hv64, HV, K_DIM, V_DIM,
             HEAD_K, HEAD_V, TF, EXACT, True)



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


@triton.jit(do_not_specialize=["num_seqs", "num_slots", "HV", "group", "s_sn", "s_sh", "s_sv", "s_sk"],
            do_not_specialize_on_alignment=["Cu_seqlens", "State_indices"])
def gdn_chunk_state(
    W, U, Qs, Fq, Kg, Aqk, Out, State, Decay, Cu_seqlens, State_indices,
    num_seqs, num_slots, HV, group, K_DIM, V_DIM, s_qt, s_qh, s_ot, s_oh, s_sn, s_sh, s_sv, s_sk,
    HEAD_K: tl.constexpr, HEAD_V: tl.constexpr, BV: tl.constexpr, TF32: tl.constexpr,
):
    """The inter-chunk recurrence and the output of one sequence, one value head, BV values.
    Grid (sequences, HV, HEAD_V // BV). The query rows are Qs[t, hv // group] (strides s_qt,
    s_qh) times Fq[t, hv]: GDN passes q itself (group HV // H) and the prep's factors, KDA the
    prep's Qg (group 1) and ones. The pool is read and written by strides (s_sv, s_sk: V-major has
    s_sk == 1, K-major s_sv == 1), so one binary serves both layouts."""
    n = tl.program_id(0)
    hv = tl.program_id(1).to(tl.int64)
    vt = tl.program_id(2)
    start = tl.load(Cu_seqlens + n)
    end = tl.load(Cu_seqlens + n + 1)
    slot = tl.load(State_indices + n).to(tl.int64)
    hq = hv // group
    offs_k = tl.arange(0, HEAD_K)
    offs_v = vt * BV + tl.arange(0, BV)
    offs_c = tl.arange(0, CHUNK)
    k_in = offs_k < K_DIM  # the tiles are HEAD_K x HEAD_V; the head K_DIM x V_DIM (padding stays zero)
    v_in = offs_v < V_DIM
    dt = Out.dtype.element_ty
    if (slot < 0) | (slot >= num_slots):  # a padded sequence: zeros out, state untouched
        for t0 in range(start, end, CHUNK):
            t = t0 + offs_c
            tl.store(Out + t.to(tl.int64)[:, None] * s_ot + hv * s_oh + offs_v[None, :],
                     tl.zeros([CHUNK, BV], dt), mask=(t < end)[:, None] & v_in[None, :])
        return
    # h[k, v] = S[v, k]: K along rows so every dot below takes its operands as they are.
    s_ptrs = State + slot * s_sn + hv * s_sh + offs_v[None, :] * s_sv + offs_k[:, None] * s_sk
    s_mask = k_in[:, None] & v_in[None, :]
    h = tl.load(s_ptrs, mask=s_mask, other=0.0)
    first_slot = start // CHUNK + n
    for c in range(0, tl.cdiv(end - start, CHUNK)):
        t = start + c * CHUNK + offs_c
        m = (t < end)[:, None]
        t = t.to(tl.int64)
        row_k = (t[:, None] * HV + hv) * HEAD_K
        w = tl.load(W + row_k + offs_k[None, :], mask=m, other=0.0)
        u = tl.load(U + (t[:, None] * HV + hv) * HEAD_V + offs_v[None, :], mask=m, other=0.0)
        q = tl.load(Qs + t[:, None] * s_qt + hq * s_qh + offs_k[None, :], mask=m & k_in[None, :], other=0.0)
        fq = tl.load(Fq + t * HV + hv, mask=t < end, other=0.0)
        kgt = tl.load(Kg + (t[None, :] * HV + hv) * HEAD_K + offs_k[:, None], mask=(t < end)[None, :], other=0.0)
        aqk = tl.load(Aqk + (t[:, None] * HV + hv) * CHUNK + offs_c[None, :], mask=m, other=0.0)
        decay = tl.load(Decay + ((first_slot + c).to(tl.int64) * HV + hv) * HEAD_K + offs_k)
        hb = h.to(w.dtype)
        vnew = (u.to(tl.float32) - _dot(w, hb, TF32)).to(w.dtype)
        o = _dot(q, hb, TF32) * fq[:, None] + _dot(aqk, vnew, TF32)
        tl.store(Out + t[:, None] * s_ot + hv * s_oh + offs_v[None, :], o.to(dt), mask=m & v_in[None, :])
        h = h * decay[:, None] + _dot(kgt, vnew, TF32)
    tl.store(s_ptrs, h, mask=s_mask)
