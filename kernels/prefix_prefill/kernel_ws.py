"""Paged prefix-prefill over int8/int4 caches (scales per token, group or channel), for sm90 (Gluon).

The same attention as kernel.py's prefix_prefill_kernel (same arguments, same grid: one program
for BLOCK_M = 128 new tokens of one request and one query head), written in Gluon
(triton.experimental.gluon) so that dequantization and the tensor cores overlap, which Triton's
tl.dot cannot express: a warp-specialized program of 16 warps.

  producer (8 warps, 72 registers): context tiles of 128 keys, K and V words loaded together,
      converted in registers (decode's packed PTX: code * scale in fp16, channel order; per group
      a scale a run of 8 channels; per channel the codes, see below), stored in a 2-stage ring of
      shared-memory tiles; then the request's new keys/values (query dtype), copied with cp.async
      straight into the same ring. mbarriers full/empty a stage.
  two consumers (4 warps each, 184 registers): 64 query rows each, wgmma Q.K^T, online softmax
      (base 2, sinks, window, causal), wgmma P.V; the context against q in fp16 (each row scaled by
      a power of two so bf16 queries fit fp16), the new tokens against q in its own dtype.
      Per-channel scales as kernel.py's: K's on q once, V's on the context's accumulator once
      after the context (the online-softmax rescaling after it is linear).

Shared memory: q twice (fp16 and the query dtype, 64 KiB) and the ring (2 stages of 128 x 128 K
and V tiles, 128 KiB): one program an SM.

Where it runs (the op decides, loader/ops/prefix_prefill.py): sm90, int8/int4 caches with any
of their scales, head_dim 80..128 in 128-wide tiles, nhd or head-major caches, fp16/bf16 output,
and calls that meet the ALIGNED specialization (16-byte aligned q/k/v/caches/out, strides and
head_dim divisible by 16): cp.async moves 16 bytes at a time, so there is no GENERIC binary.
Everything else (and the CPU interpreter: Gluon has none) runs kernel.py, as do calls whose
artifacts hold kernel.py's binary but not this kernel's.
It runs at about SDPA's speed where kernel.py takes 1.3-1.8x (BENCHMARKS.md, "Prefix prefill: aotc's caches").

Arguments the Triton kernel takes and this one ignores (the op never routes those cases here):
Out_scale / out_fp8, kv_xg (vLLM layout), the last-dim cache strides.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from aotc.kernels.common.dequant import I4X4_DEQUANT_PTX, I8X2_DEQUANT_PTX
from aotc.kernels.common.schedule import owner_of_block

from .kernel import LOG2E, NEG_BIG
from .quant import _load_scale
from .spec import DO_NOT_SPECIALIZE, DO_NOT_SPECIALIZE_ON_ALIGNMENT
STAGES = gl.constexpr(2)  # ring depth: 3 does not fit shared memory beside q
PRODUCER_WARPS = gl.constexpr(8)
CONSUMER_WARPS = gl.constexpr(4)  # a warpgroup: the launch's num_warps (the default partition)


@gluon.jit
def _ctx_load(Cw, CS, start, key_lo, ctx_len, bt_row, block_size, kv_head, s_b, s_t, s_h, s_sb, s_st, s_sh,
              kind, quant_shift, n_words, BLOCK_N: gl.constexpr, WORDS: gl.constexpr, KV_FORMAT: gl.constexpr,
              SCALES: gl.constexpr, RUN: gl.constexpr):
    """int16 words of a context tile's keys [start, start + BLOCK_N) and the fp16 scale of each
    word: per token; per group one a run of RUN words (the caller picks RUN so that a group holds
    whole runs); per channel 1 (the codes: the scales go on q and on the output). Keys outside
    [key_lo, ctx_len) and words past the head are 0 (never read). Per group both come as
    [BLOCK_N, runs, RUN]."""
    CPW: gl.constexpr = 2 if KV_FORMAT == 3 else 4  # channels a word
    ld: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[32 * 8 // WORDS, WORDS // 8],
                                        warps_per_cta=[PRODUCER_WARPS, 1], order=[1, 0])
    n = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld))
    n_valid = (n >= key_lo) & (n < ctx_len)
    blk = gl.load(bt_row + n // block_size, mask=n_valid, other=0).to(gl.int64)
    slot = (n % block_size).to(gl.int64)
    w = gl.arange(0, WORDS, layout=gl.SliceLayout(0, ld))
    x = gl.load(Cw + gl.expand_dims(blk * s_b + slot * s_t + kv_head * s_h, 1) + gl.expand_dims(w, 0),
                mask=gl.expand_dims(n_valid, 1) & gl.expand_dims(w < n_words, 0), other=0)  # 16-byte loads
    srow = blk * s_sb + slot * s_st + kv_head * s_sh
    if SCALES == 3:
        l3: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8 // RUN, RUN],
                                            threads_per_warp=[32 * 8 // WORDS, WORDS // 8, 1],
                                            warps_per_cta=[PRODUCER_WARPS, 1, 1], order=[2, 1, 0])
        l2: gl.constexpr = gl.SliceLayout(2, l3)
        x = gl.convert_layout(gl.reshape(x, [BLOCK_N, WORDS // RUN, RUN]), l3)  # the same registers, as runs
        r = gl.arange(0, WORDS // RUN, layout=gl.SliceLayout(0, l2))
        srow = gl.convert_layout(srow, gl.SliceLayout(1, l2))
        smask = (gl.expand_dims(gl.convert_layout(n_valid, gl.SliceLayout(1, l2)), 1)
                 & gl.expand_dims(r * RUN < n_words, 0))
        sc = _load_scale(CS, gl.expand_dims(srow, 1) + gl.expand_dims((r * (RUN * CPW)) >> quant_shift, 0), smask,
                         kind).to(gl.float16)
        s2 = gl.broadcast(gl.expand_dims(sc, 2), x)[0]
    elif SCALES == 1:
        sc = _load_scale(CS, srow, n_valid, kind).to(gl.float16)
        s2 = gl.broadcast(gl.expand_dims(sc, 1), x)[0]
    else:
        s2 = gl.full([BLOCK_N, WORDS], 1.0, gl.float16, layout=ld)
    return x, s2


@gluon.jit
def _ctx_store(x, s2, buf, st, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, KV_FORMAT: gl.constexpr):
    """code * scale in fp16 (x and s2 from _ctx_load), in channel order, into buf[st]."""
    if KV_FORMAT == 3:  # int8: word w = channels 2w (low byte) and 2w + 1
        a, b = gl.inline_asm_elementwise(I8X2_DEQUANT_PTX, "=r,=r,r,r", [x, s2], dtype=(gl.float16, gl.float16),
                                         is_pure=True, pack=2)
        y = gl.reshape(gl.join(a, b), [BLOCK_N, BLOCK_D])
    else:  # int4: word w = channels 4w + i in nibble i -> a, b, c, d; [w, j, s] = channel 4w + 2j + s
        a, b, c, d = gl.inline_asm_elementwise(I4X4_DEQUANT_PTX, "=r,=r,=r,=r,r,r", [x, s2],
                                               dtype=(gl.float16, gl.float16, gl.float16, gl.float16),
                                               is_pure=True, pack=2)
        y = gl.reshape(gl.join(gl.join(a, c), gl.join(b, d)), [BLOCK_N, BLOCK_D])
    buf.index(st).store(y)


@gluon.jit
def _new_tile(X, bufd, bar, st, start, new_lo, new_hi, q_start, kv_head, s_t, s_h, head_dim,
              BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr):
    """Rows [start, start + BLOCK_N) of the request's new K or V copied (cp.async, 16 bytes a
    copy) into bufd[st]; rows outside [new_lo, new_hi) and channels past head_dim are zero-filled.
    bar[st] completes when the copies have landed."""
    ld: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[32 * 8 // BLOCK_D, BLOCK_D // 8],
                                        warps_per_cta=[PRODUCER_WARPS, 1], order=[1, 0])
    n = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld))
    n_valid = (n >= new_lo) & (n < new_hi)
    row = (q_start + n).to(gl.int64) * s_t + kv_head * s_h
    d = gl.arange(0, BLOCK_D, layout=gl.SliceLayout(0, ld))
    async_copy.async_copy_global_to_shared(bufd.index(st), X + gl.expand_dims(row, 1) + gl.expand_dims(d, 0),
                                           mask=gl.expand_dims(n_valid, 1) & gl.expand_dims(d < head_dim, 0))
    async_copy.mbarrier_arrive(bar.index(st))


@gluon.jit
def _ctx_tiles(Kw, Vw, KS, VS, kb, vb, kfull, kempty, vfull, vempty, bt_row, block_size, kv_head, s_kb, s_kt, s_kh,
               s_vb, s_vt, s_vh, s_sb, s_st, s_sh, kind, quant_shift, n_words, key_lo, ctx_len, first_ctx, n_ctx,
               head_dim, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, WORDS: gl.constexpr, KV_FORMAT: gl.constexpr,
               SCALES: gl.constexpr, RUN: gl.constexpr):
    """The producer's context tiles: ring stages 0 .. n_ctx - 1."""
    for t in range(n_ctx):
        st = t % STAGES
        ph = (t // STAGES) & 1
        # both tiles' loads in flight before either is converted
        xk, sk = _ctx_load(Kw, KS, first_ctx + t * BLOCK_N, key_lo, ctx_len, bt_row, block_size, kv_head, s_kb,
                           s_kt, s_kh, s_sb, s_st, s_sh, kind, quant_shift, n_words, BLOCK_N, WORDS, KV_FORMAT, SCALES,
                           RUN)
        xv, sv = _ctx_load(Vw, VS, first_ctx + t * BLOCK_N, key_lo, ctx_len, bt_row, block_size, kv_head, s_vb,
                           s_vt, s_vh, s_sb, s_st, s_sh, kind, quant_shift, n_words, BLOCK_N, WORDS, KV_FORMAT, SCALES,
                           RUN)
        mbarrier.wait(kempty.index(st), ph ^ 1, pred=t >= STAGES)
        _ctx_store(xk, sk, kb, st, BLOCK_N, BLOCK_D, KV_FORMAT)
        fence_async_shared()
        mbarrier.arrive(kfull.index(st))
        mbarrier.wait(vempty.index(st), ph ^ 1, pred=t >= STAGES)
        _ctx_store(xv, sv, vb, st, BLOCK_N, BLOCK_D, KV_FORMAT)
        fence_async_shared()
        mbarrier.arrive(vfull.index(st))


@gluon.jit
def _producer(K, V, Kw, Vw, KS, VS, kb, vb, kbd, vbd, kfull, kempty, vfull, vempty, bt_row, block_size, kv_head,
              s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_sb, s_st, s_sh, kind, quant_shift, n_words, key_lo, ctx_len,
              first_ctx, n_ctx, new_lo, new_hi, first_new, n_new, q_start, stride_kt, stride_kh, stride_vt, stride_vh,
              head_dim, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, WORDS: gl.constexpr, KV_FORMAT: gl.constexpr,
              SCALES: gl.constexpr):
    CPW: gl.constexpr = 2 if KV_FORMAT == 3 else 4  # channels a word
    # Per group: a scale for a thread's 8 words when the group covers them (int8 groups of 16+
    # channels, int4 of 32+), else one a run of 8 channels (the smallest group); a runtime choice.
    if SCALES == 3 and quant_shift < (3 + CPW // 2):
        _ctx_tiles(Kw, Vw, KS, VS, kb, vb, kfull, kempty, vfull, vempty, bt_row, block_size, kv_head, s_kb, s_kt,
                   s_kh, s_vb, s_vt, s_vh, s_sb, s_st, s_sh, kind, quant_shift, n_words, key_lo, ctx_len, first_ctx,
                   n_ctx, head_dim, BLOCK_N, BLOCK_D, WORDS, KV_FORMAT, SCALES, 8 // CPW)
    else:
        _ctx_tiles(Kw, Vw, KS, VS, kb, vb, kfull, kempty, vfull, vempty, bt_row, block_size, kv_head, s_kb, s_kt,
                   s_kh, s_vb, s_vt, s_vh, s_sb, s_st, s_sh, kind, quant_shift, n_words, key_lo, ctx_len, first_ctx,
                   n_ctx, head_dim, BLOCK_N, BLOCK_D, WORDS, KV_FORMAT, SCALES, 8)
    for t in range(n_ctx, n_ctx + n_new):
        st = t % STAGES
        ph = (t // STAGES) & 1
        start = first_new + (t - n_ctx) * BLOCK_N
        mbarrier.wait(kempty.index(st), ph ^ 1, pred=t >= STAGES)
        _new_tile(K, kbd, kfull, st, start, new_lo, new_hi, q_start, kv_head, stride_kt, stride_kh, head_dim,
                  BLOCK_N, BLOCK_D)
        mbarrier.arrive(kfull.index(st))
        mbarrier.wait(vempty.index(st), ph ^ 1, pred=t >= STAGES)
        _new_tile(V, vbd, vfull, st, start, new_lo, new_hi, q_start, kv_head, stride_vt, stride_vh, head_dim,
                  BLOCK_N, BLOCK_D)
        mbarrier.arrive(vfull.index(st))


@gluon.constexpr_function
def _wgmma(n):
    """A consumer warpgroup's wgmma layout for [rows, n] results."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[CONSUMER_WARPS.value, 1], instr_shape=[16, n, 16])


@gluon.jit
def _qk(q, kbuf, kfull, kempty, t, s_zero, ROW0: gl.constexpr, HALF: gl.constexpr, STAGES: gl.constexpr,
        FENCE: gl.constexpr = False):
    """Ring tile t's (stage, phase) and q's rows [ROW0, ROW0 + HALF) times its K (wgmma) once the
    producer filled it, the stage's K released after (FENCE: the async-proxy fence first, for a
    tile that came by cp.async)."""
    st = t % STAGES
    ph = (t // STAGES) & 1
    mbarrier.wait(kfull.index(st), ph)
    if FENCE:
        fence_async_shared()
    s = warpgroup_mma(q.slice(ROW0, HALF), kbuf.index(st).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    mbarrier.arrive(kempty.index(st))
    return st, ph, s


@gluon.jit
def _softmax_pv(s, m_i, l_i, o, vbuf, vfull, vempty, st, ph, PDTYPE: gl.constexpr, mma_o: gl.constexpr,
                FENCE: gl.constexpr = True):
    """One online-softmax step (base 2) on the masked logits s, then o += P.V of stage st (FENCE:
    the async-proxy fence before wgmma reads the stage; off where the producer fenced its stores)."""
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
    m_new = gl.maximum(m_i, gl.max(s, 1))
    p = gl.exp2(s - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 1)
    o = o * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, mma_o)), 1)
    mbarrier.wait(vfull.index(st), ph)
    if FENCE:
        fence_async_shared()  # a new-token tile came by cp.async (generic proxy); wgmma reads it (async proxy)
    o = warpgroup_mma(gl.convert_layout(p.to(PDTYPE), p_l), vbuf.index(st), o, is_async=True)
    o = warpgroup_mma_wait(num_outstanding=0, deps=(o,))
    mbarrier.arrive(vempty.index(st))
    return m_new, l_i, o


@gluon.jit
def _q_block(Query_start_loc, pid, batch, skip_decode, BLOCK_M: gl.constexpr):
    """(request, its first query row, its query length, the q block pid runs, whether it runs) of
    program pid. A request's q blocks run last first: the causal part grows down the request, so
    the longest programs start first and the short ones fill in behind them (one program an SM)."""
    req = owner_of_block(Query_start_loc, pid, batch, BLOCK_M)  # the request owning q block pid
    q_start = gl.load(Query_start_loc + req)
    q_len = gl.load(Query_start_loc + req + 1) - q_start
    rank = pid - (q_start // BLOCK_M + req)
    n_blk = gl.cdiv(q_len, BLOCK_M)
    qblk = gl.maximum(n_blk - 1 - rank, 0)
    active = ((rank < n_blk) & ((skip_decode == 0) | (q_len != 1))).to(gl.int32)
    return req, q_start, q_len, qblk, active


@gluon.jit
def _block_keys(Query_start_loc, Seq_lens, pid, head, batch, skip_decode, num_queries_per_kv, window,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """Program pid's q block (_q_block's five), its request's context length, the head's kv head,
    the window (none: 2^31 - 1), the first context key any row's window reaches (key_lo), the
    block's last row, key_lo's tile (first), and the first tile that every row's window holds whole
    (inner_lo)."""
    req, q_start, q_len, qblk, active = _q_block(Query_start_loc, pid, batch, skip_decode, BLOCK_M)
    ctx_len = gl.load(Seq_lens + req) - q_len
    kv_head = (head // num_queries_per_kv).to(gl.int64)
    win = gl.where(window > 0, window, 2147483647)
    key_lo = gl.maximum(ctx_len + qblk * BLOCK_M - win + 1, 0)
    last_row = gl.minimum((qblk + 1) * BLOCK_M, q_len) - 1
    first = key_lo // BLOCK_N * BLOCK_N
    inner_lo = gl.maximum(gl.cdiv(gl.maximum(ctx_len + last_row - win + 1, 0), BLOCK_N) * BLOCK_N, first)
    return req, q_start, q_len, qblk, active, ctx_len, kv_head, win, key_lo, last_row, first, inner_lo


@gluon.jit
def _q_rows(Q, q_start, q_len, qblk, active, head, stride_qt, stride_qh, head_dim, BLOCK_M: gl.constexpr,
            BLOCK_D: gl.constexpr):
    """The q block [BLOCK_M, BLOCK_D] in its dtype (rows past the request and channels past the
    head: 0) and its channel indices."""
    ldq: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[32 * 8 // BLOCK_D, BLOCK_D // 8],
                                         warps_per_cta=[CONSUMER_WARPS, 1], order=[1, 0])
    offs_m = qblk * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ldq))
    m_valid = (offs_m < q_len) & (active != 0)
    q_row = (q_start + offs_m).to(gl.int64) * stride_qt + head.to(gl.int64) * stride_qh
    dq = gl.arange(0, BLOCK_D, layout=gl.SliceLayout(0, ldq))
    q = gl.load(Q + gl.expand_dims(q_row, 1) + gl.expand_dims(dq, 0),
                mask=gl.expand_dims(m_valid, 1) & gl.expand_dims(dq < head_dim, 0), other=0.0)
    return q, dq


@gluon.jit
def _fp16_rows(qf):
    """qf [rows, D] fp32 as fp16 over a power of two a row (so bf16 rows fit fp16), and that unit."""
    amax = gl.max(gl.abs(qf), 1)
    unit = gl.where(amax > 0.0, gl.exp2(gl.floor(gl.log2(gl.maximum(amax, 1e-30))) - 14.0), 1.0)
    return (qf / gl.expand_dims(unit, 1)).to(gl.float16), unit


@gluon.jit
def _ring_barriers(STAGES: gl.constexpr):
    """The ring's mbarriers, full (the producer arrives) and empty (both consumers arrive) for K
    and V, initialized and fenced before the partitions start."""
    kfull = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kempty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    vfull = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    vempty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(kfull.index(i), count=1)
        mbarrier.init(kempty.index(i), count=2)  # both consumers release a stage
        mbarrier.init(vfull.index(i), count=1)
        mbarrier.init(vempty.index(i), count=2)
    fence_async_shared()
    gl.thread_barrier()
    return kfull, kempty, vfull, vempty


@gluon.jit
def _consumer_start(Sinks, has_sinks, head, rs, qblk, ctx_len, ROW0: gl.constexpr, HALF: gl.constexpr,
                    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr):
    """A consumer's rows [ROW0, ROW0 + HALF) of q block qblk: their logit scales (rs), their rows in
    the request and positions in its sequence, and the online softmax's start (base 2): running
    max and sum from the head's sink (without one: max NEG_BIG, sum 0), a zero accumulator, and the
    zero logits wgmma starts from."""
    row_l: gl.constexpr = gl.SliceLayout(1, _wgmma(BLOCK_N))
    rsc = rs.slice(ROW0, HALF).load(row_l)
    offs_m = qblk * BLOCK_M + ROW0 + gl.arange(0, HALF, layout=row_l)
    q_pos = ctx_len + offs_m
    sink = gl.load(Sinks + head, mask=has_sinks != 0, other=float("-inf")) * LOG2E
    m_i = gl.zeros([HALF], gl.float32, layout=row_l) + gl.maximum(sink, NEG_BIG)
    l_i = gl.zeros([HALF], gl.float32, layout=row_l) + gl.exp2(sink - gl.maximum(sink, NEG_BIG))
    o = gl.zeros([HALF, BLOCK_D], gl.float32, layout=_wgmma(BLOCK_D))
    s_zero = gl.zeros([HALF, BLOCK_N], gl.float32, layout=_wgmma(BLOCK_N))
    return rsc, offs_m, q_pos, m_i, l_i, o, s_zero


@gluon.jit
def _store_rows(Out, o, l_i, v_unit, qblk, q_len, q_start, active, head, stride_ot, stride_oh, head_dim,
                ROW0: gl.constexpr, HALF: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_D: gl.constexpr,
                DTYPE: gl.constexpr, mma_o: gl.constexpr):
    """Out's rows [ROW0, ROW0 + HALF) of the q block in DTYPE: o * v_unit / l; a row with nothing
    to attend (window, or no keys at all) keeps l == 0: written as 0."""
    inv = gl.expand_dims(gl.convert_layout(v_unit / gl.where(l_i > 0.0, l_i, 1.0), gl.SliceLayout(1, mma_o)), 1)
    rows_o = qblk * BLOCK_M + ROW0 + gl.arange(0, HALF, layout=gl.SliceLayout(1, mma_o))
    row_ok = (rows_o < q_len) & (active != 0)
    rows_off = (q_start + rows_o).to(gl.int64) * stride_ot + head.to(gl.int64) * stride_oh
    d = gl.arange(0, BLOCK_D, layout=gl.SliceLayout(0, mma_o))
    Od = Out.to(gl.pointer_type(DTYPE), bitcast=True)
    gl.store(Od + gl.expand_dims(rows_off, 1) + gl.expand_dims(d, 0), (o * inv).to(DTYPE),
             mask=gl.expand_dims(row_ok, 1) & gl.expand_dims(d < head_dim, 0))


@gluon.jit
def _consumer(Out, Sinks, has_sinks, head, qc, qr, rs, vs, kb, vb, kbd, vbd, kfull, kempty, vfull, vempty, qk_scale,
              qblk, q_len, q_start, active, ctx_len, key_lo, inner_lo, inner_hi, first_ctx, n_ctx, new_lo, first_new,
              new_inner_lo, n_new, win, stride_ot, stride_oh, head_dim, ROW0: gl.constexpr, HALF: gl.constexpr,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, SCALES: gl.constexpr):
    """Rows [ROW0, ROW0 + HALF) of the q block: context tiles, then new-token tiles, then the store."""
    DTYPE: gl.constexpr = qr.dtype
    mma_o: gl.constexpr = _wgmma(BLOCK_D)
    col_l: gl.constexpr = gl.SliceLayout(0, _wgmma(BLOCK_N))
    # rsc: the context's logit scale a row (its q scaling undone)
    rsc, offs_m, q_pos, m_i, l_i, o, s_zero = _consumer_start(Sinks, has_sinks, head, rs, qblk, ctx_len, ROW0, HALF,
                                                               BLOCK_M, BLOCK_N, BLOCK_D)
    for t in range(n_ctx):
        st, ph, s = _qk(qc, kb, kfull, kempty, t, s_zero, ROW0, HALF, STAGES)
        start = first_ctx + t * BLOCK_N
        nc = start + gl.arange(0, BLOCK_N, layout=col_l)
        s = s * gl.expand_dims(rsc, 1)
        # tiles wholly inside the context and every row's window need no mask
        if (start < inner_lo) | (start + BLOCK_N > inner_hi):
            okc = (gl.expand_dims((nc >= key_lo) & (nc < ctx_len), 0)
                   & (gl.expand_dims(q_pos, 1) - gl.expand_dims(nc, 0) < win))
            s = gl.where(okc, s, float("-inf"))
        m_i, l_i, o = _softmax_pv(s, m_i, l_i, o, vb, vfull, vempty, st, ph, gl.float16, mma_o)
    if SCALES == 2:  # per channel: the context's values were codes (later softmax rescaling is linear)
        o = o * gl.expand_dims(vs.load(gl.SliceLayout(0, mma_o)), 0)
    for t in range(n_ctx, n_ctx + n_new):
        st, ph, s = _qk(qr, kbd, kfull, kempty, t, s_zero, ROW0, HALF, STAGES, True)  # (fenced: a cp.async tile)
        nstart = first_new + (t - n_ctx) * BLOCK_N
        n = nstart + gl.arange(0, BLOCK_N, layout=col_l)
        s = s * qk_scale
        # tiles below the diagonal and inside every row's window need no mask
        if (nstart + BLOCK_N > qblk * BLOCK_M) | (nstart < new_inner_lo):
            ok = (gl.expand_dims(n >= new_lo, 0) & (gl.expand_dims(n, 0) <= gl.expand_dims(offs_m, 1))
                  & (gl.expand_dims(offs_m, 1) - gl.expand_dims(n, 0) < win))
            s = gl.where(ok, s, float("-inf"))
        m_i, l_i, o = _softmax_pv(s, m_i, l_i, o, vbd, vfull, vempty, st, ph, DTYPE, mma_o)
    _store_rows(Out, o, l_i, 1.0, qblk, q_len, q_start, active, head, stride_ot, stride_oh, head_dim, ROW0, HALF,
                BLOCK_M, BLOCK_D, DTYPE, mma_o)


@gluon.jit(do_not_specialize=DO_NOT_SPECIALIZE, do_not_specialize_on_alignment=DO_NOT_SPECIALIZE_ON_ALIGNMENT)
def prefix_prefill_ws_kernel(
    Q, K, V, K_cache, V_cache, Out,
    Block_table, Query_start_loc, Seq_lens, K_scale, V_scale, Out_scale, Sinks,
    sm_scale, batch, num_queries_per_kv, block_size, stride_bt, window, has_sinks, out_fp8,
    skip_decode, kv_xg, scale_kind, stride_ksb, stride_kst, stride_ksh,
    head_dim, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_kcb, stride_kct, stride_kch, stride_kcd, stride_vcb, stride_vct, stride_vch, stride_vcd,
    BLOCK_D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, KV_FORMAT: gl.constexpr,
    SCALES: gl.constexpr,
):
    gl.static_assert(BLOCK_M == 2 * 64, "two consumer warpgroups of 64 rows")
    WORDS: gl.constexpr = BLOCK_D // 2 if KV_FORMAT == 3 else BLOCK_D // 4  # int16 words a cache row
    HALF: gl.constexpr = BLOCK_M // 2
    DTYPE: gl.constexpr = Q.dtype.element_ty
    pid = gl.program_id(0)
    head = gl.program_id(1)
    # context keys [key_lo, ctx_len) in tiles from first_ctx; those in [inner_lo, inner_hi) need no mask
    req, q_start, q_len, qblk, active, ctx_len, kv_head, win, key_lo, last_row, first_ctx, inner_lo = _block_keys(
        Query_start_loc, Seq_lens, pid, head, batch, skip_decode, num_queries_per_kv, window, BLOCK_M, BLOCK_N)
    qk_scale = sm_scale * LOG2E
    inner_hi = ctx_len // BLOCK_N * BLOCK_N
    n_ctx = gl.where(first_ctx < ctx_len, gl.cdiv(ctx_len - first_ctx, BLOCK_N), 0) * active
    # new keys [new_lo, new_hi) in tiles from first_new; below new_inner_lo a tile needs the window mask
    new_lo = gl.maximum(qblk * BLOCK_M - win + 1, 0)
    new_hi = last_row + 1
    first_new = new_lo // BLOCK_N * BLOCK_N
    new_inner_lo = gl.maximum(gl.cdiv(gl.maximum(last_row - win + 1, 0), BLOCK_N) * BLOCK_N, first_new)
    n_new = gl.maximum(gl.cdiv(new_hi - first_new, BLOCK_N), 0) * active

    # q in its dtype (new tokens) and in fp16 over a power of two a row (context, fp16 tiles)
    q, dq = _q_rows(Q, q_start, q_len, qblk, active, head, stride_qt, stride_qh, head_dim, BLOCK_M, BLOCK_D)
    kind = scale_kind & 3  # the scales' dtype; per group, log2(group) above it
    quant_shift = scale_kind >> 2
    qf = q.to(gl.float32)
    if SCALES == 2:  # per channel: K's scales go on q (the context tiles hold the codes)
        qf = qf * gl.expand_dims(_load_scale(K_scale, kv_head * stride_ksh + dq, dq < head_dim, kind), 0)
    qh, unit = _fp16_rows(qf)
    q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_D], gl.float16)
    qd_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_D], DTYPE)
    kv_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_D], gl.float16)
    kvd_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_D], DTYPE)
    r_sl: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    qc = gl.allocate_shared_memory(gl.float16, [BLOCK_M, BLOCK_D], q_sl, qh)
    qr = gl.allocate_shared_memory(DTYPE, [BLOCK_M, BLOCK_D], qd_sl, q)
    rs = gl.allocate_shared_memory(gl.float32, [BLOCK_M], r_sl, unit * qk_scale)
    # per channel: V's scales, applied to the context's accumulator (the tiles hold the codes)
    vs = gl.allocate_shared_memory(gl.float32, [BLOCK_D], r_sl,
                                   _load_scale(V_scale, kv_head * stride_ksh + dq, (dq < head_dim) & (SCALES == 2),
                                               kind))
    # the ring: fp16 context tiles, or the same bytes as query-dtype new-token tiles
    kb = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, BLOCK_D], kv_sl)
    vb = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, BLOCK_D], kv_sl)
    kbd = kb._reinterpret(DTYPE, [STAGES, BLOCK_N, BLOCK_D], kvd_sl)
    vbd = vb._reinterpret(DTYPE, [STAGES, BLOCK_N, BLOCK_D], kvd_sl)
    kfull, kempty, vfull, vempty = _ring_barriers(STAGES)
    Kw = K_cache.to(gl.pointer_type(gl.int16), bitcast=True)
    Vw = V_cache.to(gl.pointer_type(gl.int16), bitcast=True)
    bt_row = Block_table + req.to(gl.int64) * stride_bt
    n_words = head_dim // 2 if KV_FORMAT == 3 else head_dim // 4
    gl.warp_specialize([
        (_consumer, (Out, Sinks, has_sinks, head, qc, qr, rs, vs, kb, vb, kbd, vbd, kfull, kempty, vfull, vempty,
                     qk_scale, qblk, q_len, q_start, active, ctx_len, key_lo, inner_lo, inner_hi, first_ctx, n_ctx,
                     new_lo, first_new, new_inner_lo, n_new, win, stride_ot, stride_oh, head_dim, 0, HALF, BLOCK_M,
                     BLOCK_N, BLOCK_D, SCALES)),
        (_consumer, (Out, Sinks, has_sinks, head, qc, qr, rs, vs, kb, vb, kbd, vbd, kfull, kempty, vfull, vempty,
                     qk_scale, qblk, q_len, q_start, active, ctx_len, key_lo, inner_lo, inner_hi, first_ctx, n_ctx,
                     new_lo, first_new, new_inner_lo, n_new, win, stride_ot, stride_oh, head_dim, HALF, HALF,
                     BLOCK_M, BLOCK_N, BLOCK_D, SCALES)),
        (_producer, (K, V, Kw, Vw, K_scale, V_scale, kb, vb, kbd, vbd, kfull, kempty, vfull, vempty, bt_row,
                     block_size, kv_head, stride_kcb, stride_kct, stride_kch, stride_vcb, stride_vct, stride_vch,
                     stride_ksb, stride_kst, stride_ksh, kind, quant_shift, n_words, key_lo, ctx_len, first_ctx,
                     n_ctx, new_lo, new_hi, first_new, n_new, q_start, stride_kt, stride_kh, stride_vt, stride_vh,
                     head_dim, BLOCK_N, BLOCK_D, WORDS, KV_FORMAT, SCALES)),
    ], [CONSUMER_WARPS, PRODUCER_WARPS], [184, 72])
