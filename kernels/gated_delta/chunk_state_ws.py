"""The chunked gated delta rule's state pass for sm90, warp-specialized (Gluon).

The same recurrence, arguments and grid (sequences, HV, HEAD_V // BV) as chunk.py's
gdn_chunk_state, for 16-bit inputs at K, V tiles <= 128:

  producer (4 warps; 8 beside two consumers, so the launch's warps stay a power of two): per chunk,
      cp.async copies of W, q, Kg [64, K], Aqk [64, 64], U [64, BV] and the decay [K] into a ring of
      STAGES shared-memory stages (mbarriers full/empty), as far ahead as the ring allows.
  NC consumers (one warpgroup each, the first the default partition), BV // NC value columns each:
      the state tile h [K, BV // NC] in fp32 registers and its 16-bit copy in shared memory (wgmma's
      B operand). Per chunk only W h -> V' = U - W h -> h exp(G_last) + Kg^T V' is sequential; q h
      and Aqk V' are issued asynchronously beside it (wgmma groups retire in order, so each wait
      names what it needs). Two consumers share one ring: the chunk's tiles are read once a head.

The state update is chunk.py's products in the same dtypes (final states bit-identical to it on the
H100); the output too: Aqk V' accumulated onto q h fq, the order Triton's dot-plus-add takes.
Served where the op asks for it (state_ws_spec.ws_serves: sm90, fp16/bf16, ALIGNED arguments, as
cp.async copies 16 bytes); everything else runs chunk.py's kernel. Speed: BENCHMARKS.md, Kernel
choices: Gluon state pass.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

CHUNK = gl.constexpr(64)
CONSUMER_WARPS = gl.constexpr(4)  # a warpgroup; the first is the default partition (the launch's num_warps)


@gluon.jit
def _copy_rows(dst, P, t0, end, s_t, off, n_cols, D: gl.constexpr, PW: gl.constexpr):
    """Rows t0 .. t0 + 63 of a row-major operand (row t at P + t * s_t + off, D columns, the first
    n_cols real) into dst [64, D] by cp.async; rows at or past `end` and columns past n_cols are
    zero-filled."""
    ld: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[32 * 8 // D, D // 8],
                                        warps_per_cta=[PW, 1], order=[1, 0])
    t = t0 + gl.arange(0, CHUNK, layout=gl.SliceLayout(1, ld))
    c = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    ptrs = P + gl.expand_dims(t.to(gl.int64) * s_t + off, 1) + gl.expand_dims(c, 0)
    async_copy.async_copy_global_to_shared(dst, ptrs, mask=gl.expand_dims(t < end, 1) & gl.expand_dims(c < n_cols, 0))


@gluon.jit
def _producer(W, U, Qs, Kg, Aqk, Decay, w_s, u_s, q_s, kg_s, a_s, d_s, full, empty, start, end, n_chunks,
              first_slot, hv, hq, HV, s_qt, s_qh, K_DIM, v0, HEAD_K: gl.constexpr, HEAD_V: gl.constexpr,
              BC: gl.constexpr, NC: gl.constexpr, STAGES: gl.constexpr, PW: gl.constexpr):
    ld1: gl.constexpr = gl.BlockedLayout(size_per_thread=[4], threads_per_warp=[32], warps_per_cta=[PW],
                                         order=[0])
    offs_d = gl.arange(0, HEAD_K, layout=ld1)
    for c in range(n_chunks):
        st = c % STAGES
        ph = (c // STAGES) & 1
        mbarrier.wait(empty.index(st), ph ^ 1, pred=c >= STAGES)
        t0 = start + c * CHUNK
        _copy_rows(w_s.index(st), W, t0, end, HV * HEAD_K, hv * HEAD_K, HEAD_K, HEAD_K, PW)
        _copy_rows(q_s.index(st), Qs, t0, end, s_qt, hq * s_qh, K_DIM, HEAD_K, PW)
        for i in gl.static_range(NC):  # each consumer's columns of U
            _copy_rows(u_s.index(st * NC + i), U, t0, end, HV * HEAD_V, hv * HEAD_V + v0 + i * BC, BC, BC, PW)
        _copy_rows(kg_s.index(st), Kg, t0, end, HV * HEAD_K, hv * HEAD_K, HEAD_K, HEAD_K, PW)
        _copy_rows(a_s.index(st), Aqk, t0, end, HV * CHUNK, hv * CHUNK, CHUNK, CHUNK, PW)
        async_copy.async_copy_global_to_shared(
            d_s.index(st), Decay + ((first_slot + c).to(gl.int64) * HV + hv) * HEAD_K + offs_d)
        # every producer thread arrives once its own copies have landed (count: all of them)
        async_copy.mbarrier_arrive(full.index(st), increment_count=False)


@gluon.jit
def _opaque(x):
    """x through an asm the compiler may not merge or move: the pool's addresses after the chunk loop
    are formed again there instead of being kept live (spilled) across it."""
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _state_ptrs(State, slot, hv, s_sn, s_sh, s_sv, s_sk, offs_v, HEAD_K: gl.constexpr, rows_l: gl.constexpr,
                AGAIN: gl.constexpr):
    """h[k, v] = S[v, k]: the pool tile's addresses by its strides (V-major or K-major)."""
    offs_k = gl.arange(0, HEAD_K, layout=rows_l)
    if AGAIN:
        offs_k = _opaque(offs_k)
        offs_v = _opaque(offs_v)
    return (State + slot * s_sn + hv * s_sh + gl.expand_dims(offs_k * s_sk, 1)
            + gl.expand_dims(offs_v.to(gl.int64) * s_sv, 0))


@gluon.jit
def _state_mask(K_DIM, valid, v_in, HEAD_K: gl.constexpr, rows_l: gl.constexpr):
    offs_k = gl.arange(0, HEAD_K, layout=rows_l)
    return gl.expand_dims((offs_k < K_DIM) & valid, 1) & gl.expand_dims(v_in, 0)


@gluon.jit
def _consumer(Out, State, Fq, w_s, u_s, q_s, kg_s, a_s, d_s, h_s, vn_s, full, empty, start, end, n_chunks, n_zero,
              valid, slot, hv, HV, K_DIM, V_DIM, v0, s_ot, s_oh, s_sn, s_sh, s_sv, s_sk, HEAD_K: gl.constexpr,
              BV: gl.constexpr, NC: gl.constexpr, CI: gl.constexpr, STAGES: gl.constexpr):
    """Consumer CI of NC: columns [v0, v0 + BV) of the program's value tile."""
    DT: gl.constexpr = w_s.dtype
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[CONSUMER_WARPS, 1],
                                                  instr_shape=[16, BV, 16])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    cols_l: gl.constexpr = gl.SliceLayout(0, mma)
    offs_c = gl.arange(0, CHUNK, layout=rows_l)
    offs_v = v0 + gl.arange(0, BV, layout=cols_l)
    v_in = offs_v < V_DIM
    o_cols = hv * s_oh + offs_v
    ODT: gl.constexpr = Out.dtype.element_ty
    for c in range(n_zero):  # a padded sequence: zeros out, state untouched
        t = start + c * CHUNK + offs_c
        gl.store(Out + gl.expand_dims(t.to(gl.int64) * s_ot, 1) + gl.expand_dims(o_cols, 0),
                 gl.zeros([CHUNK, BV], ODT, layout=mma), mask=gl.expand_dims(t < end, 1) & gl.expand_dims(v_in, 0))
    h = gl.load(_state_ptrs(State, slot, hv, s_sn, s_sh, s_sv, s_sk, offs_v, HEAD_K, rows_l, False),
                mask=_state_mask(K_DIM, valid, v_in, HEAD_K, rows_l), other=0.0)
    h_s.store(h.to(DT))
    fence_async_shared()
    zero = gl.zeros([CHUNK, BV], gl.float32, layout=mma)
    for c in range(n_chunks):
        st = c % STAGES
        ph = (c // STAGES) & 1
        t = start + c * CHUNK + offs_c
        tm = t < end
        t64 = t.to(gl.int64)
        fq = gl.load(Fq + t64 * HV + hv, mask=tm, other=0.0)
        mbarrier.wait(full.index(st), ph)
        fence_async_shared()  # the stage came by cp.async (generic proxy); wgmma reads it (async proxy)
        wh = warpgroup_mma(w_s.index(st), h_s, zero, use_acc=False, is_async=True)
        qh = warpgroup_mma(q_s.index(st), h_s, zero, use_acc=False, is_async=True)
        wh = warpgroup_mma_wait(num_outstanding=1, deps=(wh,))
        u = u_s.index(st * NC + CI).load(mma)
        vn_s.store((u.to(gl.float32) - wh).to(DT))
        fence_async_shared()
        dec = d_s.index(st).load(rows_l)
        h = h * gl.expand_dims(dec, 1)
        hn = warpgroup_mma(kg_s.index(st).permute((1, 0)), vn_s, h, is_async=True)
        qh = warpgroup_mma_wait(num_outstanding=1, deps=(qh,))
        o = warpgroup_mma(a_s.index(st), vn_s, qh * gl.expand_dims(fq, 1), is_async=True)  # Aqk V' on q h fq
        h = warpgroup_mma_wait(num_outstanding=1, deps=(hn,))
        h_s.store(h.to(DT))
        fence_async_shared()
        o = warpgroup_mma_wait(num_outstanding=0, deps=(o,))
        mbarrier.arrive(empty.index(st))
        gl.store(Out + gl.expand_dims(t64 * s_ot, 1) + gl.expand_dims(o_cols, 0), o.to(ODT),
                 mask=gl.expand_dims(tm, 1) & gl.expand_dims(v_in, 0))
    # the pool's addresses formed again here: not kept live across the loop
    gl.store(_state_ptrs(State, slot, hv, s_sn, s_sh, s_sv, s_sk, offs_v, HEAD_K, rows_l, True), h,
             mask=_state_mask(K_DIM, valid, v_in, HEAD_K, rows_l))


@gluon.jit(do_not_specialize=["num_seqs", "num_slots", "HV", "group", "s_sn", "s_sh", "s_sv", "s_sk"],
           do_not_specialize_on_alignment=["Cu_seqlens", "State_indices"])
def gdn_chunk_state_ws(
    W, U, Qs, Fq, Kg, Aqk, Out, State, Decay, Cu_seqlens, State_indices,
    num_seqs, num_slots, HV, group, K_DIM, V_DIM, s_qt, s_qh, s_ot, s_oh, s_sn, s_sh, s_sv, s_sk,
    HEAD_K: gl.constexpr, HEAD_V: gl.constexpr, BV: gl.constexpr, NC: gl.constexpr,
):
    """chunk.gdn_chunk_state's contract: one sequence, one value head, BV values a program, split
    among NC consumer warpgroups (BV // NC columns each) that share the producer's ring."""
    gl.static_assert(HEAD_K <= 128, "K tiles up to 128")
    gl.static_assert(HEAD_V <= 128, "V tiles up to 128")
    gl.static_assert((NC == 1) | (NC == 2), "1 or 2 consumers")
    BC: gl.constexpr = BV // NC
    # The launch's warps: NC consumer warpgroups and a producer of PW warps, a power of two in all
    # (the manifest's rule). Registers of the worker partitions within the SM's 64K: one consumer,
    # the producer 4 x 72; two consumers, 2 x 128 x CR + 256 x 48 (CR: ptxas, Triton 3.6, no spills).
    PW: gl.constexpr = 8 if NC == 2 else 4
    PRODUCER_REGS: gl.constexpr = 48 if NC == 2 else 72
    CONSUMER_REGS: gl.constexpr = 208
    # the ring: stages of W, q, Kg [64, K], Aqk [64, 64], U [64, BV], decay [K] (bf16, K 128: 61 KiB
    # at BV 32, 73 at 128), beside h and V' (12 KiB a 32-column consumer)
    STAGES: gl.constexpr = 3 if BV * HEAD_K <= 64 * 128 else 2
    DT: gl.constexpr = W.dtype.element_ty
    n = gl.program_id(0)
    hv = gl.program_id(1)
    v0 = gl.program_id(2) * BV
    start = gl.load(Cu_seqlens + n)
    end = gl.load(Cu_seqlens + n + 1)
    slot = gl.load(State_indices + n).to(gl.int64)
    valid = (slot >= 0) & (slot < num_slots)
    n_all = gl.cdiv(end - start, CHUNK)
    n_chunks = gl.where(valid, n_all, 0)
    n_zero = n_all - n_chunks
    slot = gl.where(valid, slot, 0)
    hq = hv // group
    hv64 = hv.to(gl.int64)
    hq64 = hq.to(gl.int64)

    row_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([CHUNK, HEAD_K], DT)
    w_s = gl.allocate_shared_memory(DT, [STAGES, CHUNK, HEAD_K], row_sl)
    q_s = gl.allocate_shared_memory(DT, [STAGES, CHUNK, HEAD_K], row_sl)
    kg_s = gl.allocate_shared_memory(DT, [STAGES, CHUNK, HEAD_K], row_sl)
    a_s = gl.allocate_shared_memory(DT, [STAGES, CHUNK, CHUNK], gl.NVMMASharedLayout.get_default_for([CHUNK, CHUNK], DT))
    u_s = gl.allocate_shared_memory(DT, [STAGES * NC, CHUNK, BC], gl.NVMMASharedLayout.get_default_for([CHUNK, BC], DT))
    d_s = gl.allocate_shared_memory(gl.float32, [STAGES, HEAD_K],
                                    gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0]))
    h_s = gl.allocate_shared_memory(DT, [NC, HEAD_K, BC], gl.NVMMASharedLayout.get_default_for([HEAD_K, BC], DT))
    vn_s = gl.allocate_shared_memory(DT, [NC, CHUNK, BC], gl.NVMMASharedLayout.get_default_for([CHUNK, BC], DT))
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=PW * 32)
        mbarrier.init(empty.index(i), count=NC)  # every consumer releases a stage
    fence_async_shared()
    gl.thread_barrier()
    first_slot = start // CHUNK + n
    if NC == 1:
        gl.warp_specialize([
            (_consumer, (Out, State, Fq, w_s, u_s, q_s, kg_s, a_s, d_s, h_s.index(0), vn_s.index(0), full, empty, start,
                         end, n_chunks, n_zero, valid, slot, hv64, HV, K_DIM, V_DIM, v0, s_ot, s_oh, s_sn, s_sh, s_sv,
                         s_sk, HEAD_K, BC, NC, 0, STAGES)),
            (_producer, (W, U, Qs, Kg, Aqk, Decay, w_s, u_s, q_s, kg_s, a_s, d_s, full, empty, start, end, n_chunks,
                         first_slot, hv64, hq64, HV, s_qt, s_qh, K_DIM, v0, HEAD_K, HEAD_V, BC, NC, STAGES, PW)),
        ], [PW], [PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (Out, State, Fq, w_s, u_s, q_s, kg_s, a_s, d_s, h_s.index(0), vn_s.index(0), full, empty, start,
                         end, n_chunks, n_zero, valid, slot, hv64, HV, K_DIM, V_DIM, v0, s_ot, s_oh, s_sn, s_sh, s_sv,
                         s_sk, HEAD_K, BC, NC, 0, STAGES)),
            (_consumer, (Out, State, Fq, w_s, u_s, q_s, kg_s, a_s, d_s, h_s.index(1), vn_s.index(1), full, empty, start,
                         end, n_chunks, n_zero, valid, slot, hv64, HV, K_DIM, V_DIM, v0 + BC, s_ot, s_oh, s_sn, s_sh,
                         s_sv, s_sk, HEAD_K, BC, NC, 1, STAGES)),
            (_producer, (W, U, Qs, Kg, Aqk, Decay, w_s, u_s, q_s, kg_s, a_s, d_s, full, empty, start, end, n_chunks,
                         first_slot, hv64, hq64, HV, s_qt, s_qh, K_DIM, v0, HEAD_K, HEAD_V, BC, NC, STAGES, PW)),
        ], [CONSUMER_WARPS, PW], [CONSUMER_REGS, PRODUCER_REGS])
