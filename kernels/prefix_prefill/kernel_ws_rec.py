"""Paged prefix-prefill with every key read from the cache (vLLM's unified_attention), for sm90 (Gluon).

kernel_ws.py's warp-specialized program (16 warps, one program an SM: 128 new tokens of one request
and one query head) for the calls it does not take: the new tokens' keys and values already in the
cache after the context (the op's k = v = None), one causal loop over the cache, on
  int8 (KV_FORMAT 3) and fp8 e4m3 (1) codes with one scale a token and kv head (SCALES 1): vLLM's
      INT8_PER_TOKEN_HEAD / FP8_PER_TOKEN_HEAD record [K codes | K scale | V codes | V scale] a
      (token, kv head), whose K rows are 8-byte and V rows only 4-byte aligned; value = code * scale rounded once to
      fp16, as quant.py's word tiles (the same PTX arithmetic);
  fp8 e4m3 with one scale a cache (SCALES 0, vLLM's FP8_PER_TENSOR): value * 2^-8 in the tiles
      (exact), the scales and the 2^8 on q's logit scale and on the output, as kernel.py does.

  producer (8 warps): tiles of 128 keys, record rows read 8 bytes a load (K) and 4 (V), per-cache
      rows 16 (a 128-byte row over 8 threads, 4 rows a thread), converted in registers by packed PTX (four codes a
      register), stored in a 2-stage ring of fp16 shared-memory tiles; mbarriers full/empty a
      stage. (A ring of 3, int32 words, a producer loading tile t + 1 while storing tile t, and K's
      scale on the score columns were not faster: BENCHMARKS.md, Tried and not kept.)
  two consumers (4 warps each): 64 query rows each, wgmma Q.K^T in fp16 (q scaled by a power of
      two a row), online softmax (base 2, sinks, window, causal on the tiles past the q block's
      first position), wgmma P.V.

Shared memory: q once (fp16, 32 KiB) and the ring (128 KiB). Where it runs (the op decides,
loader/ops/prefix_prefill.py, spec.rec_serves): sm90, k = v = None, head_dim 80..128 (multiples of
16: q and out take 16-byte loads), cache addresses and byte strides multiples of 8 (K) and 4 (V)
for the records, of 16 per cache, fp16/bf16 out.
Its ALIGNED binary assumes only q's and out's alignment (spec.REC_ARGS); the caches' is the op's
check. Everything else runs kernel.py.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from aotc.kernels.common.dequant import E4M3X4_BITS_PTX, E4M3X4_DEQUANT_PTX, I8X4_DEQUANT_PTX

from .kernel import LOG2E
from .kernel_ws import (CONSUMER_WARPS, PRODUCER_WARPS, _block_keys, _consumer_start, _fp16_rows, _q_rows, _qk,
                         _ring_barriers, _softmax_pv, _store_rows, _wgmma)
from .quant import _load_scale
from .spec import REC_DO_NOT_SPECIALIZE, REC_DO_NOT_SPECIALIZE_ON_ALIGNMENT

STAGES = gl.constexpr(2)  # ring depth: 3 fits beside one q, not faster (BENCHMARKS.md, Kernel choices: ring depth)
# the producer's tiles: 4 rows a thread (8 threads a row), so that few row offsets live in its
# registers. vLLM's record: V's 4 bytes a load (its rows are 4 bytes past an 8-byte boundary), K's 8
# (LD8); per-cache fp8 rows 16 (LD16). Fewer loads and stores, the same rows a thread (BENCHMARKS.md,
# Kernel choices: producer loads)
LD = gl.constexpr(gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[4, 8],
                                   warps_per_cta=[PRODUCER_WARPS, 1], order=[1, 0]))
LD8 = gl.constexpr(gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                    warps_per_cta=[PRODUCER_WARPS, 1], order=[1, 0]))
LD16 = gl.constexpr(gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[4, 8],
                                     warps_per_cta=[PRODUCER_WARPS, 1], order=[1, 0]))

@gluon.jit
def _rec_rows(start, key_lo, ctx_hi, bt_row, block_size, BLOCK_N: gl.constexpr):
    """(which keys [start, start + BLOCK_N) count, their block, their slot): K's and V's loads share them."""
    n = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LD))
    n_valid = (n >= key_lo) & (n < ctx_hi)
    blk = gl.load(bt_row + n // block_size, mask=n_valid, other=0).to(gl.int64)
    return n_valid, blk, (n % block_size).to(gl.int64)


@gluon.jit
def _rec_load(Cb, CS, n_valid, blk, slot, kv_head, s_b, s_t, s_h, s_sb, s_st, s_sh, kind, head_dim,
              BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, SCALES: gl.constexpr, L: gl.constexpr,
              VEC: gl.constexpr):
    """The code bytes [BLOCK_N, BLOCK_D] of _rec_rows' keys (strides in bytes) in layout L, VEC bytes
    a load, and, SCALES 1, each key's scale in fp16 (0 otherwise). Keys that do not count and
    channels past head_dim are 0 (their scores are masked)."""
    # LD, LD8 and LD16 give a thread the same rows: no data moves
    n_valid = gl.convert_layout(n_valid, gl.SliceLayout(1, L))
    blk = gl.convert_layout(blk, gl.SliceLayout(1, L))
    slot = gl.convert_layout(slot, gl.SliceLayout(1, L))
    c = gl.arange(0, BLOCK_D, layout=gl.SliceLayout(0, L))
    ptrs = Cb + gl.expand_dims(blk * s_b + slot * s_t + kv_head * s_h, 1) + gl.expand_dims(c, 0)
    ptrs = gl.multiple_of(ptrs, [1, VEC])  # rows VEC-byte aligned (the op checks addresses and strides)
    x = gl.load(ptrs, mask=gl.expand_dims(n_valid, 1) & gl.expand_dims(c < head_dim, 0), other=0)
    if SCALES == 1:
        sc = _load_scale(CS, blk * s_sb + slot * s_st + kv_head * s_sh, n_valid, kind).to(gl.float16)
    else:
        sc = gl.zeros([BLOCK_N], gl.float16, layout=gl.SliceLayout(1, L))
    return x, sc


@gluon.jit
def _rec_store(x, sc, buf, st, KV_FORMAT: gl.constexpr, SCALES: gl.constexpr):
    """_rec_load's codes as fp16 values (SCALES 1: code * scale; 0: e4m3 value * 2^-8) into buf[st]."""
    if SCALES == 1:
        s2 = gl.broadcast(gl.expand_dims(sc, 1), x)[0]
        if KV_FORMAT == 3:
            y = gl.inline_asm_elementwise(I8X4_DEQUANT_PTX, "=r,=r,r,r,r", [x, s2], dtype=gl.float16, is_pure=True,
                                          pack=4)
        else:
            y = gl.inline_asm_elementwise(E4M3X4_DEQUANT_PTX, "=r,=r,r,r,r", [x, s2], dtype=gl.float16,
                                          is_pure=True, pack=4)
    else:
        y = gl.inline_asm_elementwise(E4M3X4_BITS_PTX, "=r,=r,r", [x], dtype=gl.float16, is_pure=True, pack=4)
    buf.index(st).store(y)


@gluon.jit
def _rec_producer(Kb, Vb, KS, VS, kb, vb, kfull, kempty, vfull, vempty, bt_row, block_size, kv_head, s_kb, s_kt, s_kh,
                  s_vb, s_vt, s_vh, s_sb, s_st, s_sh, kind, key_lo, ctx_hi, first, n_ctx, head_dim,
                  BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, KV_FORMAT: gl.constexpr, SCALES: gl.constexpr):
    for t in range(n_ctx):
        st = t % STAGES
        ph = (t // STAGES) & 1
        start = first + t * BLOCK_N
        # both tiles' loads in flight before either is converted
        n_valid, blk, slot = _rec_rows(start, key_lo, ctx_hi, bt_row, block_size, BLOCK_N)
        if SCALES == 1:  # vLLM's record: K's rows 8-byte aligned, V's 4
            xk, sk = _rec_load(Kb, KS, n_valid, blk, slot, kv_head, s_kb, s_kt, s_kh, s_sb, s_st, s_sh, kind,
                               head_dim, BLOCK_N, BLOCK_D, SCALES, LD8, 8)
            xv, sv = _rec_load(Vb, VS, n_valid, blk, slot, kv_head, s_vb, s_vt, s_vh, s_sb, s_st, s_sh, kind,
                               head_dim, BLOCK_N, BLOCK_D, SCALES, LD, 4)
        else:
            xk, sk = _rec_load(Kb, KS, n_valid, blk, slot, kv_head, s_kb, s_kt, s_kh, s_sb, s_st, s_sh, kind,
                               head_dim, BLOCK_N, BLOCK_D, SCALES, LD16, 16)
            xv, sv = _rec_load(Vb, VS, n_valid, blk, slot, kv_head, s_vb, s_vt, s_vh, s_sb, s_st, s_sh, kind,
                               head_dim, BLOCK_N, BLOCK_D, SCALES, LD16, 16)
        mbarrier.wait(kempty.index(st), ph ^ 1, pred=t >= STAGES)
        _rec_store(xk, sk, kb, st, KV_FORMAT, SCALES)
        fence_async_shared()
        mbarrier.arrive(kfull.index(st))
        mbarrier.wait(vempty.index(st), ph ^ 1, pred=t >= STAGES)
        _rec_store(xv, sv, vb, st, KV_FORMAT, SCALES)
        fence_async_shared()
        mbarrier.arrive(vfull.index(st))


@gluon.jit
def _rec_consumer(Out, Sinks, has_sinks, head, qc, rs, v_unit, kb, vb, kfull, kempty, vfull, vempty, qblk, q_len,
                  q_start, active, ctx_len, key_lo, ctx_hi, inner_lo, inner_hi, first, n_ctx, win, stride_ot,
                  stride_oh, head_dim, ROW0: gl.constexpr, HALF: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, DTYPE: gl.constexpr):
    """Rows [ROW0, ROW0 + HALF) of the q block over keys [key_lo, ctx_hi), then the store."""
    mma_o: gl.constexpr = _wgmma(BLOCK_D)
    # rsc: the logit scale a row (its q scaling undone)
    rsc, _, q_pos, m_i, l_i, o, s_zero = _consumer_start(Sinks, has_sinks, head, rs, qblk, ctx_len, ROW0, HALF, BLOCK_M,
                                                          BLOCK_N, BLOCK_D)
    for t in range(n_ctx):
        st, ph, s = _qk(qc, kb, kfull, kempty, t, s_zero, ROW0, HALF, STAGES)
        start = first + t * BLOCK_N
        s = s * gl.expand_dims(rsc, 1)
        # tiles below the q block's first position and inside every row's window need no mask
        if (start < inner_lo) | (start + BLOCK_N > inner_hi):
            # causal and window: keys below key_lo are past the window of every row, and keys
            # from ctx_hi on lie past every valid row's own position
            nc = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, _wgmma(BLOCK_N)))
            dist = gl.expand_dims(q_pos, 1) - gl.expand_dims(nc, 0)
            ok = (dist >= 0) & (dist < win)
            s = gl.where(ok, s, float("-inf"))
        # the producer fenced its register stores before arriving: no fence here
        m_i, l_i, o = _softmax_pv(s, m_i, l_i, o, vb, vfull, vempty, st, ph, gl.float16, mma_o, False)
    _store_rows(Out, o, l_i, v_unit, qblk, q_len, q_start, active, head, stride_ot, stride_oh, head_dim, ROW0,
                HALF, BLOCK_M, BLOCK_D, DTYPE, mma_o)


@gluon.jit(do_not_specialize=REC_DO_NOT_SPECIALIZE, do_not_specialize_on_alignment=REC_DO_NOT_SPECIALIZE_ON_ALIGNMENT)
def prefix_prefill_ws_rec_kernel(
    Q, K, V, K_cache, V_cache, Out,
    Block_table, Query_start_loc, Seq_lens, K_scale, V_scale, Out_scale, Sinks,
    sm_scale, batch, num_queries_per_kv, block_size, stride_bt, window, has_sinks, out_fp8,
    skip_decode, kv_xg, scale_kind, stride_ksb, stride_kst, stride_ksh,
    head_dim, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_kcb, stride_kct, stride_kch, stride_kcd, stride_vcb, stride_vct, stride_vch, stride_vcd,
    BLOCK_D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, KV_FORMAT: gl.constexpr,
    SCALES: gl.constexpr,
):
    # K, V, their strides and Out_scale are not read (the keys are in the cache; out_fp8 is kernel.py's).
    gl.static_assert(BLOCK_M == 2 * 64, "two consumer warpgroups of 64 rows")
    HALF: gl.constexpr = BLOCK_M // 2
    DTYPE: gl.constexpr = Q.dtype.element_ty
    if SCALES == 0:  # per-cache fp8: the op's grid for kernel.py's float/fp8 path, (q_heads, q blocks)
        pid = gl.program_id(1)
        head = gl.program_id(0)
    else:
        pid = gl.program_id(0)
        head = gl.program_id(1)
    # keys [key_lo, ctx_hi) in tiles from first: the context, then the new tokens up to the block's
    # last row; tiles in [inner_lo, inner_hi) lie below its first row and inside every row's window
    req, q_start, q_len, qblk, active, ctx_len, kv_head, win, key_lo, last_row, first, inner_lo = _block_keys(
        Query_start_loc, Seq_lens, pid, head, batch, skip_decode, num_queries_per_kv, window, BLOCK_M, BLOCK_N)
    qk_scale = sm_scale * LOG2E
    ctx_hi = ctx_len + last_row + 1
    inner_hi = (ctx_len + qblk * BLOCK_M) // BLOCK_N * BLOCK_N
    n_ctx = gl.cdiv(ctx_hi - first, BLOCK_N) * active

    q, _ = _q_rows(Q, q_start, q_len, qblk, active, head, stride_qt, stride_qh, head_dim, BLOCK_M, BLOCK_D)
    kind = scale_kind & 3  # the per-token scales' dtype
    qh, unit = _fp16_rows(q.to(gl.float32))
    logit = unit * qk_scale
    v_unit = 1.0
    if SCALES == 0:  # one scale a cache: the tiles hold value * 2^-8
        logit = logit * (gl.load(K_scale.to(gl.pointer_type(gl.float32), bitcast=True)) * 256.0)
        v_unit = gl.load(V_scale.to(gl.pointer_type(gl.float32), bitcast=True)) * 256.0
    q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_D], gl.float16)
    kv_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_D], gl.float16)
    r_sl: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    qc = gl.allocate_shared_memory(gl.float16, [BLOCK_M, BLOCK_D], q_sl, qh)
    rs = gl.allocate_shared_memory(gl.float32, [BLOCK_M], r_sl, logit)
    kb = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, BLOCK_D], kv_sl)
    vb = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, BLOCK_D], kv_sl)
    kfull, kempty, vfull, vempty = _ring_barriers(STAGES)
    bt_row = Block_table + req.to(gl.int64) * stride_bt
    # the op passes per-token caches' strides in int16 words (quant.py's), per-tensor fp8's in bytes
    unit_b: gl.constexpr = 2 if SCALES == 1 else 1
    gl.warp_specialize([
        (_rec_consumer, (Out, Sinks, has_sinks, head, qc, rs, v_unit, kb, vb, kfull, kempty, vfull, vempty, qblk,
                         q_len, q_start, active, ctx_len, key_lo, ctx_hi, inner_lo, inner_hi, first, n_ctx, win,
                         stride_ot, stride_oh, head_dim, 0, HALF, BLOCK_M, BLOCK_N, BLOCK_D, DTYPE)),
        (_rec_consumer, (Out, Sinks, has_sinks, head, qc, rs, v_unit, kb, vb, kfull, kempty, vfull, vempty, qblk,
                         q_len, q_start, active, ctx_len, key_lo, ctx_hi, inner_lo, inner_hi, first, n_ctx, win,
                         stride_ot, stride_oh, head_dim, HALF, HALF, BLOCK_M, BLOCK_N, BLOCK_D, DTYPE)),
        (_rec_producer, (K_cache, V_cache, K_scale, V_scale, kb, vb, kfull, kempty, vfull, vempty, bt_row, block_size,
                         kv_head, stride_kcb * unit_b, stride_kct * unit_b, stride_kch * unit_b, stride_vcb * unit_b,
                         stride_vct * unit_b, stride_vch * unit_b, stride_ksb, stride_kst, stride_ksh, kind, key_lo,
                         ctx_hi, first, n_ctx, head_dim, BLOCK_N, BLOCK_D, KV_FORMAT, SCALES)),
    ], [CONSUMER_WARPS, PRODUCER_WARPS], [184, 72])
