"""Recurrent decode of the gated delta rule (Gated DeltaNet and KDA) over a pool of fp32 states.

One program per (request b, value head hv, tile of BV value rows): it loads its [BV, K] slice
of the request's state h once, runs the T <= 8 tokens of the request through it in registers and
stores it once. The grid is (cdiv(V, BV), HV, B): it depends on no length, so one CUDA graph
serves every step, and a program finds its tile from its three ids without a division (the
value tiles of one head are x neighbours: the head's state streams in order). Per token
(reference.py):

    h  = h * exp(g)         g: one log-gate a head (GDN) or one a head and K channel (KDA)
    v' = beta * (v - h k)
    h  = h + v' k^T
    o  = scale * h q

The state is a bandwidth problem (a [V, K] fp32 matrix a head read and written per step against
a few hundred bytes of q/k/v), so the layout of the tile is what matters:
  KMAJOR = 0: V-major pool [slots, HV, V, K], K contiguous: each row of the tile is K contiguous
              floats (16-byte vector loads along K).
  KMAJOR = 1: K-major pool [slots, HV, K, V], V contiguous: the tile is read as BV contiguous
              floats per K row. A constexpr, not a runtime stride: a runtime unit stride would
              leave Triton unable to prove contiguity, and every state access would be a scalar.
The other state strides (slot, head, the non-unit row stride) are runtime ints, except in the
packed V-major tile (PACKED): K is the tile, rows are K apart and V a multiple of BV, so the
tile's offsets are constants off one base and nothing along K or V is masked (fewer registers:
the one-token GDN step at K = 128 fits 64, 32 programs an SM). NT: the token count fixed at
compile time (T is not read; 1: a packed binary for one token, without the token loop), 0: T tokens.

KS: the parts of a state row one thread holds (2 in the packed GDN "long" loop at K = 128). The tile
is then [BV, KS, BK // KS] and every K vector [KS, BK // KS], loaded in that shape so the parts sit
in one thread's registers: a row spans 32 // KS lanes, so a row sum takes 4 shuffle levels over 4
rows a thread instead of 5 over 8 (46 shuffles a token where 90), q and k at 8 values a thread.
It pays from T = 6, where the loop's instructions bound it (BENCHMARKS.md, gated delta decode).

The state is read from State and written to State_out (the same tensor in place, or the op's
final_state). Row b's state is slot state_indices[b] of the pool, or with `dense` set state[b]
itself: no index to read before the tile's addresses (flash-linear-attention's h0 -> ht).

The gate's shape is a constexpr (PER_K): GDN's one log-gate a head is a scalar, KDA's one a
head and K channel a [BK] vector with a runtime K stride. The fused-gate form (`fused` != 0)
reads a (G), b (Beta), A_log and dt_bias instead of g and beta and computes
g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b) here. Gate tensors (g, beta, a, b,
A_log, dt_bias) arrive as byte pointers with a runtime dtype code each (0 fp32, 1 fp16, 2 bf16),
so their dtype costs no binary: they are a few bytes a token next to the state.

Registers decide the speed: a one-warp program holds 32 state floats a thread, and the fewer
registers the rest takes, the more programs an SM keeps in flight to cover each token's memory
round trip. So the GDN path holds nothing across the token loop that it can read again: its
gate scalars (g, beta, and the fused form's A_log and dt_bias) are loaded each token, branch-free
(_load_scalar) and before q/k/v, so one round trip serves the token; the state tile's offsets
inside the head are int32; and the store's addresses are derived again after the loop.
Token 0 runs ahead of the loop, its inputs read right after the slot and before the state tile:
their round trip and layout changes (the 4-warp K-major tile's shared-memory exchanges) overlap
the slot's, so when the tile arrives only the update is left. Packed tiles of 128 and 256 columns
with 16-bit q/k/v (TILE_FIRST) issue the tile's loads first instead, in a block of their own: the
dense form's by program id before anything else (flash-linear-attention's order), a pool's once
the slot is read, token 0's inputs then read during the tile's round trip.

Head sizes: K and V are runtime ints (K_DIM, V_DIM); the tile holds BK >= K columns (BK a power
of two, a constexpr) and every load and store along K or V is masked (but in the packed tile),
so K = 60 or 100 runs in the 64- or 128-column binary and the padded columns of the tile stay
zero. q/k/v/out in fp32
(the `dtype` axis) are read and written as they are: the update runs in fp32 in every case.

A state index < 0 or >= num_slots is a padded row: its state is neither read nor written (every
state access is masked by it) and its outputs are zeros. Offsets into the pool are int64. The
GVA group's division is a shift where the group is a power of two (group_shift >= 0).
"""
import triton
import triton.language as tl

L2NORM_EPS = tl.constexpr(1e-6)  # as reference.py and flash-linear-attention's l2norm
SOFTPLUS_THRESHOLD = tl.constexpr(20.0)  # as torch.nn.functional.softplus and SGLang


@triton.jit
def _load_f32(P, offs, code, mask):
    """Load a byte pointer `P` as fp32 (code 0), fp16 (1) or bf16 (2) elements at element
    offsets `offs` where `mask` holds (zeros elsewhere), widened to fp32."""
    if code == 0:
        x = tl.load(P.to(tl.pointer_type(tl.float32), bitcast=True) + offs, mask=mask, other=0.0)
    elif code == 1:
        x = tl.load(P.to(tl.pointer_type(tl.float16), bitcast=True) + offs, mask=mask, other=0.0).to(tl.float32)
    else:
        x = tl.load(P.to(tl.pointer_type(tl.bfloat16), bitcast=True) + offs, mask=mask, other=0.0).to(tl.float32)
    return x


@triton.jit
def _load_scalar(P, off, code, mask):
    """`_load_f32` of one element without a branch on the code: its low (or only) 16 bits and,
    when fp32, its high 16 bits two bytes on, each a load predicated by the code, so the load
    issues beside the token's other loads and nothing waits on it before they are issued."""
    p = P.to(tl.pointer_type(tl.uint16), bitcast=True) + off * tl.where(code == 0, 2, 1)
    lo = tl.load(p, mask=mask, other=0).to(tl.uint32)
    hi = tl.load(p + 1, mask=mask & (code == 0), other=0).to(tl.uint32)
    f16 = lo.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    bits = tl.where(code == 0, lo | (hi << 16), lo << 16)  # fp32, or bf16 widened by its bits
    return tl.where(code == 1, f16, bits.to(tl.float32, bitcast=True))


@triton.jit(
    do_not_specialize=[
        "T", "group", "group_shift", "num_slots", "dense",
        "stride_gb", "stride_gt", "stride_gh", "stride_gk", "stride_bb", "stride_bt", "stride_bh",
        "stride_dh", "stride_dk", "g_code", "beta_code", "alog_code", "dt_code", "fused", "qk_l2norm",
    ],
    do_not_specialize_on_alignment=["G", "Beta", "A_log", "Dt_bias", "Idx"],
)
def gated_delta_decode_kernel(
    Q, K, V, Out, State, State_out, G, Beta, A_log, Dt_bias, Idx,
    scale,
    T, group, group_shift, num_slots, dense, K_DIM, V_DIM,
    stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh, stride_ob, stride_ot, stride_oh,
    stride_sn, stride_sh, stride_srow,
    stride_gb, stride_gt, stride_gh, stride_gk, stride_bb, stride_bt, stride_bh, stride_dh, stride_dk,
    g_code, beta_code, alog_code, dt_code, fused, qk_l2norm,
    BK: tl.constexpr, BV: tl.constexpr, KMAJOR: tl.constexpr, PER_K: tl.constexpr, PACKED: tl.constexpr,
    NT: tl.constexpr, KS: tl.constexpr,
):
    i_v = tl.program_id(0)
    hv = tl.program_id(1)
    b = tl.program_id(2)  # the loader keeps B and HV within a grid's 65535
    # (BENCHMARKS.md, gated delta decode against fla; the 64-column one-token step and fp32 q/k/v's
    # one-token steps spill with it)
    TILE_FIRST: tl.constexpr = PACKED and BK >= 128 and Q.dtype.element_ty != tl.float32
    if not TILE_FIRST:
        hq = _query_head(hv, group, group_shift)
    offs_k = _k_offsets(BK, KS)
    offs_v = i_v * BV + tl.arange(0, BV)
    if PACKED:  # constant masks: Triton drops them from every load and store
        k_mask = tl.full(offs_k.shape, 1, tl.int1)
        v_mask = tl.full([BV], 1, tl.int1)
    else:
        k_mask = offs_k < K_DIM  # BK: K rounded up to the built tile; the rest of the tile stays zero
        v_mask = offs_v < V_DIM
    if TILE_FIRST:
        # The state tile's loads first, in a block of their own (in one block with token 0's, ptxas
        # issues token 0's address arithmetic and loads ahead of them): in the dense form by program
        # id alone; in a pool once the slot is read, token 0's inputs then read during its round trip.
        tile = _tile_offsets(offs_k, offs_v, stride_srow, KMAJOR, PACKED, BK, KS)
        if dense != 0:  # state[b] (the loader checks that state holds B rows): no index read, no mask
            h = _load_tile(State, b, hv, tile, stride_sn, stride_sh, True)
            slot = b
        else:
            slot = tl.load(Idx + b)
            h = _load_tile(State, tl.maximum(slot, 0), hv, tile, stride_sn, stride_sh,
                           (slot >= 0) & (slot < num_slots))
        hq = _query_head(hv, group, group_shift)
        q_row, k_row, v_row, o_row, g_row, beta_row, g, a_log, dt_h, beta, q, k, v = _token0(
            Q, K, V, Out, G, Beta, A_log, Dt_bias, b, hv, hq, offs_k, k_mask, offs_v, v_mask,
            stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
            stride_ob, stride_oh, stride_gb, stride_gt, stride_gh, stride_gk, stride_bb, stride_bt, stride_bh,
            stride_dh, g_code, beta_code, alog_code, dt_code, fused, PER_K)
        valid = (slot >= 0) & (slot < num_slots)
    else:
        q_row, k_row, v_row, o_row, g_row, beta_row = _row_offsets(
            Q, K, V, Out, b, hv, hq, stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_ob, stride_oh,
            stride_gb, stride_gh, stride_bb, stride_bh)
        # The slot's read, then token 0's inputs (they do not need the slot), then the state tile.
        slot = _slot(Idx, b, dense)
        g, a_log, dt_h, beta, q, k, v = _token_inputs(
            Q, K, V, G, Beta, A_log, Dt_bias, q_row, k_row, v_row, g_row, beta_row, 0, hv,
            offs_k, k_mask, offs_v, v_mask, stride_qt, stride_kt, stride_vt, stride_gt, stride_gk, stride_bt,
            stride_dh, g_code, beta_code, alog_code, dt_code, fused, PER_K)
        valid = (slot >= 0) & (slot < num_slots)
        head = State + tl.maximum(slot, 0).to(tl.int64) * stride_sn + hv.to(tl.int64) * stride_sh
        h = tl.load(head + _tile_offsets(offs_k, offs_v, stride_srow, KMAJOR, PACKED, BK, KS),
                    mask=valid & _rows(v_mask, KS) & _cols(k_mask, KS), other=0.0)  # [BV, (KS,) BK // KS] fp32

    decay = tl.full([], 0.0, tl.float32)
    dt = tl.zeros(offs_k.shape, dtype=tl.float32)
    if PER_K:
        if fused:
            # KDA: -exp(A_log) and the [K] dt_bias, read once (a vector is dearer to read each token).
            decay = -tl.exp(_load_f32(A_log, hv, alog_code, True))
            dt = _load_f32(Dt_bias, hv * stride_dh + offs_k * stride_dk, dt_code, k_mask)

    h, o = _token_step(h, g, a_log, dt_h, beta, q, k, v, decay, dt, scale, fused, qk_l2norm, PER_K, KS)
    tl.store(o_row + offs_v, tl.where(valid, o, 0.0).to(Out.dtype.element_ty), mask=v_mask)
    for t in range(1, NT if NT else T):
        g, a_log, dt_h, beta, q, k, v = _token_inputs(
            Q, K, V, G, Beta, A_log, Dt_bias, q_row, k_row, v_row, g_row, beta_row, t, hv,
            offs_k, k_mask, offs_v, v_mask, stride_qt, stride_kt, stride_vt, stride_gt, stride_gk, stride_bt,
            stride_dh, g_code, beta_code, alog_code, dt_code, fused, PER_K)
        h, o = _token_step(h, g, a_log, dt_h, beta, q, k, v, decay, dt, scale, fused, qk_l2norm, PER_K, KS)
        tl.store(o_row + t * stride_ot + offs_v, tl.where(valid, o, 0.0).to(Out.dtype.element_ty), mask=v_mask)
    # The store's addresses come from a second read of the slot, so the compiler cannot keep the
    # load's (a register a row) live across the token loop.
    slot = _slot(Idx, b, dense)
    valid = (slot >= 0) & (slot < num_slots)
    head = State_out + tl.maximum(slot, 0).to(tl.int64) * stride_sn + hv.to(tl.int64) * stride_sh
    # (A split packed tile's store takes the runtime row stride, equal to BK there: its constant
    # offsets would be the load's, kept live across the loop.)
    tl.store(head + _tile_offsets(offs_k, offs_v, stride_srow, KMAJOR, PACKED and KS == 1, BK, KS), h,
             mask=valid & _rows(v_mask, KS) & _cols(k_mask, KS))


@triton.jit
def _load_tile(State, slot, hv, tile, stride_sn, stride_sh, valid):
    """The state tile at element offsets `tile` of head hv in pool slot `slot`, fp32 (zeros where
    not `valid`)."""
    return tl.load(State + slot.to(tl.int64) * stride_sn + hv.to(tl.int64) * stride_sh + tile, mask=valid, other=0.0)


@triton.jit
def _row_offsets(Q, K, V, Out, b, hv, hq, stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh,
                 stride_ob, stride_oh, stride_gb, stride_gh, stride_bb, stride_bh):
    """Row b's q, k, v and out pointers (query head hq, value head hv) and gate and beta offsets."""
    q_row = Q + b.to(tl.int64) * stride_qb + hq * stride_qh
    k_row = K + b.to(tl.int64) * stride_kb + hq * stride_kh
    v_row = V + b.to(tl.int64) * stride_vb + hv * stride_vh
    o_row = Out + b.to(tl.int64) * stride_ob + hv * stride_oh
    g_row = b.to(tl.int64) * stride_gb + hv * stride_gh
    beta_row = b.to(tl.int64) * stride_bb + hv * stride_bh
    return q_row, k_row, v_row, o_row, g_row, beta_row


@triton.jit
def _token0(Q, K, V, Out, G, Beta, A_log, Dt_bias, b, hv, hq, offs_k, k_mask, offs_v, v_mask,
            stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
            stride_ob, stride_oh, stride_gb, stride_gt, stride_gh, stride_gk, stride_bb, stride_bt, stride_bh,
            stride_dh, g_code, beta_code, alog_code, dt_code, fused, PER_K: tl.constexpr):
    """Row b's pointers and offsets (_row_offsets) and token 0's inputs (_token_inputs)."""
    q_row, k_row, v_row, o_row, g_row, beta_row = _row_offsets(
        Q, K, V, Out, b, hv, hq, stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_ob, stride_oh,
        stride_gb, stride_gh, stride_bb, stride_bh)
    g, a_log, dt_h, beta, q, k, v = _token_inputs(
        Q, K, V, G, Beta, A_log, Dt_bias, q_row, k_row, v_row, g_row, beta_row, 0, hv,
        offs_k, k_mask, offs_v, v_mask, stride_qt, stride_kt, stride_vt, stride_gt, stride_gk, stride_bt,
        stride_dh, g_code, beta_code, alog_code, dt_code, fused, PER_K)
    return q_row, k_row, v_row, o_row, g_row, beta_row, g, a_log, dt_h, beta, q, k, v


@triton.jit
def _query_head(hv, group, group_shift):
    """The query head of value head hv: a shift where the GVA group is a power of two."""
    if group_shift >= 0:
        hq = hv >> group_shift
    else:
        hq = hv // group
    return hq


@triton.jit
def _slot(Idx, b, dense):
    """Row b's state slot: b itself in the dense form (no read), else state_indices[b]."""
    slot = b
    if dense == 0:
        slot = tl.load(Idx + b)
    return slot


@triton.jit
def _tile_offsets(offs_k, offs_v, stride_srow, KMAJOR: tl.constexpr, PACKED: tl.constexpr, BK: tl.constexpr,
                  KS: tl.constexpr):
    """[BV, BK] (or split, [BV, KS, BK // KS]) int32 element offsets of the state tile inside its
    head (the loader checks that a head's rows fit int32); the packed tile's rows are BK apart."""
    if PACKED:
        return _rows(offs_v, KS) * BK + _cols(offs_k, KS)
    elif KMAJOR:
        return _cols(offs_k, KS) * stride_srow + _rows(offs_v, KS)
    else:
        return _rows(offs_v, KS) * stride_srow + _cols(offs_k, KS)


@triton.jit
def _k_offsets(BK: tl.constexpr, KS: tl.constexpr):
    """The K axis: [BK], or split in KS parts [KS, BK // KS] (a load of the split shape puts its
    parts in one thread's registers; a reshaped [BK] load would not)."""
    if KS == 1:
        return tl.arange(0, BK)
    else:
        return tl.arange(0, KS)[:, None] * (BK // KS) + tl.arange(0, BK // KS)[None, :]


@triton.jit
def _rows(x, KS: tl.constexpr):
    """A [BV] vector along the tile's rows."""
    if KS == 1:
        return x[:, None]
    else:
        return x[:, None, None]


@triton.jit
def _cols(x, KS: tl.constexpr):
    """A K vector (_k_offsets' shape) along the tile's K axis."""
    if KS == 1:
        return x[None, :]
    else:
        return x[None, :, :]


@triton.jit
def _row_sum(x, KS: tl.constexpr):
    """The tile's sum along K: [BV]."""
    if KS == 1:
        return tl.sum(x, 1)
    else:
        return tl.sum(tl.reshape(x, [x.shape[0], x.shape[1] * x.shape[2]]), 1)


@triton.jit
def _token_inputs(Q, K, V, G, Beta, A_log, Dt_bias, q_row, k_row, v_row, g_row, beta_row, t, hv,
                  offs_k, k_mask, offs_v, v_mask, stride_qt, stride_kt, stride_vt, stride_gt, stride_gk, stride_bt,
                  stride_dh, g_code, beta_code, alog_code, dt_code, fused, PER_K: tl.constexpr):
    """Token t's gate (g: a scalar, or [BK] when PER_K; the fused form's a_log and dt_h scalars),
    beta, and q, k, v in fp32. The gate's loads first: nothing between them and q/k/v's waits."""
    if PER_K:
        g = _load_f32(G, g_row + t * stride_gt + offs_k * stride_gk, g_code, k_mask)  # [BK]
        a_log = 0.0
        dt_h = 0.0
    else:
        g = _load_scalar(G, g_row + t * stride_gt, g_code, True)
        a_log = _load_scalar(A_log, hv, alog_code, fused != 0)
        dt_h = _load_scalar(Dt_bias, hv * stride_dh, dt_code, fused != 0)
    beta = _load_scalar(Beta, beta_row + t * stride_bt, beta_code, True)
    q = tl.load(q_row + t * stride_qt + offs_k, mask=k_mask, other=0.0).to(tl.float32)
    k = tl.load(k_row + t * stride_kt + offs_k, mask=k_mask, other=0.0).to(tl.float32)
    v = tl.load(v_row + t * stride_vt + offs_v, mask=v_mask, other=0.0).to(tl.float32)
    return g, a_log, dt_h, beta, q, k, v


@triton.jit
def _token_step(h, g, a_log, dt_h, beta, q, k, v, decay, dt, scale, fused, qk_l2norm, PER_K: tl.constexpr,
                KS: tl.constexpr):
    """One token through the [BV, BK] state tile h: (h', o) of the module docstring's update."""
    if qk_l2norm:
        q = q / tl.sqrt(tl.sum(q * q) + L2NORM_EPS)
        k = k / tl.sqrt(tl.sum(k * k) + L2NORM_EPS)
    if fused:
        if PER_K:
            x = g + dt
            g = decay * tl.where(x <= SOFTPLUS_THRESHOLD, tl.log(1.0 + tl.exp(x)), x)
        else:
            x = g + dt_h
            g = -tl.exp(a_log) * tl.where(x <= SOFTPLUS_THRESHOLD, tl.log(1.0 + tl.exp(x)), x)
        beta = 1.0 / (1.0 + tl.exp(-beta))
    if PER_K:
        h = h * _cols(tl.exp(g), KS)
    else:
        h = h * tl.exp(g)
    v_new = beta * (v - _row_sum(h * _cols(k, KS), KS))
    h = h + _rows(v_new, KS) * _cols(k, KS)
    o = _row_sum(h * _cols(q, KS), KS) * scale
    return h, o
