"""Paged prefix-prefill attention: new query tokens attend to a cached context, then causally to themselves.

One program computes BLOCK_M new tokens of one request for one query head: first over the
context held in the paged cache (fp16/bf16, fp8 bits with a scale, or int8/int4 codes with
per-token, per-group or per-channel scales: quant.py), then over the request's own new keys (read from
`K`/`V`, not from the cache) with the causal mask. Online softmax in base 2, optional attention
sinks, optional sliding window, optional fp8 output; runtime options (spec.OPTION_ARGS): softcap
and ALiBi on the scores (read by SCORE_MOD binaries only), and kv_from_cache (the new tokens' keys
and values read from the cache after the context, for callers whose cache already holds them:
vLLM's unified attention).

head_dim is a runtime value: tiles are BLOCK_D wide (a power of two) and masked on d < head_dim,
so one binary serves every head size of its bucket (24 and 32; 40..64; 72..128; 136..256).

Ported facts (vLLM `prefix_prefill.py`, `unified_attention.py`): the two cache layouts and the
flattened q-block schedule. Two upstream bugs are avoided on purpose: V tiles outside the window
were still read there (NaN in an unused page then poisons the result through 0 * NaN), and the
block-table gather of a tail tile could read past the request's row. Here every K/V/block-table
load is masked by the keys the tile actually needs, and probabilities are masked as well.
Tiles wholly inside the context (or below the diagonal) and inside every row's window skip all
masks (BENCHMARKS.md, Kernel choices: mask-free tiles).

Caches, their scales and the output are passed as byte (uint8) pointers and reinterpreted here
by the constexpr KV_FORMAT / the runtime out_fp8 and scale_kind flags: Triton refuses the fp8e4nv type on sm80 at
all, so fp8 is decoded with bit operations (packed PTX on CUDA, plain Triton elsewhere), which every
target compiles.

Cache strides (in elements of the cache dtype), per layout:
  nhd   K, V [blocks, block_size, kv_heads, D]: addr = blk*s_b + tok*s_t + head*s_h + d
        (a head-major cache [blocks, kv_heads, block_size, D] is the same path with other strides)
  vllm  K [blocks, kv_heads, D//X, block_size, X]: addr = blk*s_b + head*s_h + (d//X)*s_d + tok*X + d%X
        V [blocks, kv_heads, D, block_size]:      addr = blk*s_b + head*s_h + d*s_d + tok
        or vLLM's interleaved V (pack factor P = s_t, s_d = P): addr = blk*s_b + head*s_h +
          (tok // P)*D*P + d*P + tok % P; plain V passes s_t = block_size (tok // s_t = 0)
        X is runtime (kv_xg = X // 8): vLLM packs X = 8 even for one-byte fp8 caches, and 16 // size
        elsewhere. Offsets are written from d // 8 and d % 8 so that runs of 8 stay contiguous and
        8-aligned to the compiler (16-byte vector loads for fp16/bf16, as with a constexpr X).
Strides a layout does not use are passed as 0.
"""
import triton
import triton.language as tl

from aotc.kernels.common.dequant import _fp8_bits_to_fp16
from aotc.kernels.common.schedule import owner_of_block
from aotc.kernels.common.score_mod import _score_mod

from .quant import int_context, softmax_step
from .spec import KERNEL_DO_NOT_SPECIALIZE, KERNEL_DO_NOT_SPECIALIZE_ON_ALIGNMENT

LOG2E = tl.constexpr(1.4426950408889634)
# Finite "minus infinity" for the running max: exp2(m_old - m_new) stays 0 or 1, never NaN,
# when a whole tile is masked for a row.
NEG_BIG = tl.constexpr(-1.0e30)


@triton.jit
def _fp8_bits_to_half(bits, KV_FORMAT: tl.constexpr, PTX: tl.constexpr):
    """uint8 fp8 bits -> fp16. e5m2 is exact; e4m3 comes out as value * 2^-8 (exact, normals
    and subnormals alike, because its exponent field lands inside fp16's), which the caller
    folds into the scale. An e4m3 NaN (0x7f) decodes as the finite 480. decode's converter
    (kernels/common/dequant.py): four bytes a register in packed PTX on CUDA, plain Triton
    elsewhere, the same bits (tests/gpu/test_decode.py checks every byte value); faster than 32-bit
    integer operations an element (BENCHMARKS.md, Kernel choices: fp8 decoding)."""
    KIND: tl.constexpr = 3 if KV_FORMAT == 1 else 4  # decode's KV_KIND: 3 e4m3, else e5m2
    return _fp8_bits_to_fp16(bits.to(tl.int8, bitcast=True), KIND, PTX)


@triton.jit
def _fp32_to_e4m3_bits(x):
    """fp32 -> e4m3fn bits (int32), round to nearest even, saturated at +-448 (never NaN)."""
    x = tl.minimum(tl.maximum(x, -448.0), 448.0)
    sign = ((x.to(tl.int32, bitcast=True) >> 31) & 1) << 7
    a = tl.abs(x)
    ab = a.to(tl.int32, bitcast=True)
    # Normals: round the 23-bit mantissa to 3 bits (nearest even), rebias the exponent 127 -> 7.
    normal = ((ab + 0x7FFFF + ((ab >> 20) & 1)) >> 20) - (120 << 3)
    # Below 2^-6 e4m3 is a multiple of 2^-9: adding 2^23 rounds a*512 to an integer, nearest even.
    sub = ((a * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)
    return tl.where(a < 0.015625, sub, normal) | sign


@triton.jit
def _attend(acc, m_i, l_i, q, k, v, mask, qk_scale, rel_q, rel_k, softcap, slope, alibi_mode,
            MASKED: tl.constexpr, SCORE_MOD: tl.constexpr):
    """One online-softmax step over a K/V tile; `mask` [BLOCK_M, BLOCK_N] marks allowed pairs
    (MASKED tiles only). k and v are already zero where their keys are masked, so no 0 * NaN.
    SCORE_MOD binaries apply softcap and ALiBi (_score_mod) to the scores first."""
    qk = tl.dot(q, tl.trans(k))
    if SCORE_MOD:
        qk = _score_mod(qk * (qk_scale / LOG2E), rel_q, rel_k, softcap, slope, alibi_mode) * LOG2E
        p, alpha, m_new, l_i = softmax_step(qk, m_i, l_i, mask, 1.0, MASKED)
    else:
        p, alpha, m_new, l_i = softmax_step(qk, m_i, l_i, mask, qk_scale, MASKED)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i


@triton.jit
def _load_kv(ptrs, row_valid, d_valid, MASK_ROWS: tl.constexpr):
    # head_dim is runtime: d is always masked. With head_dim % 16 == 0 (the ALIGNED binary) the
    # mask is constant over 16 channels, so loads stay 16-byte vectors.
    if MASK_ROWS:
        return tl.load(ptrs, mask=row_valid[:, None] & d_valid[None, :], other=0)
    else:
        return tl.load(ptrs, mask=d_valid[None, :], other=0)


@triton.jit
def _ctx_offsets(start, key_lo, ctx_len, blk, block_size, kv_head, stride_kcb, stride_kct, stride_kch, stride_kcd,
                 stride_vcb, stride_vct, stride_vch, stride_vcd, kv_xg, head_dim, BLOCK_D: tl.constexpr,
                 BLOCK_N: tl.constexpr, KV_VLLM: tl.constexpr):
    """(K offsets, V offsets, key positions, which keys count) of the context tile at `start`
    whose keys lie in blocks `blk`. vllm layout: V's tokens go in groups of stride_vct (the block
    size; vLLM's interleaved V cache: its pack factor, groups [D, pack] apart by D * pack)."""
    offs_d = tl.arange(0, BLOCK_D)
    n = start + tl.arange(0, BLOCK_N)
    n_valid = (n < ctx_len) & (n >= key_lo)
    slot = (n % block_size).to(tl.int64)
    if KV_VLLM:
        d_hi = offs_d // 8
        k_d = (d_hi // kv_xg) * stride_kcd + (d_hi % kv_xg) * 8 + offs_d % 8
        k_off = (blk * stride_kcb + kv_head * stride_kch + slot * (kv_xg * 8))[:, None] + k_d[None, :]
        v_tok = (slot // stride_vct) * (head_dim * stride_vct) + slot % stride_vct
        v_off = (blk * stride_vcb + kv_head * stride_vch + v_tok)[:, None] + (offs_d * stride_vcd)[None, :]
    else:
        k_off = (blk * stride_kcb + slot * stride_kct + kv_head * stride_kch)[:, None] + offs_d[None, :]
        v_off = (blk * stride_vcb + slot * stride_vct + kv_head * stride_vch)[:, None] + offs_d[None, :]
    return k_off, v_off, n, n_valid


@triton.jit
def _ctx_blocks(start, key_lo, ctx_len, bt_row, block_size, BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    """Cache blocks of the keys of the context tile at `start`: masked, only the blocks holding
    keys < ctx_len are read (never past the request's row)."""
    n = start + tl.arange(0, BLOCK_N)
    if MASKED:
        return tl.load(bt_row + n // block_size, mask=(n < ctx_len) & (n >= key_lo), other=0).to(tl.int64)
    else:
        return tl.load(bt_row + n // block_size).to(tl.int64)


@triton.jit
def _chunk_blocks(keys, ctx_len, bt_row, block_size):
    """Cache blocks [CHUNK, BLOCK_N] of a chunk of context tiles' keys (row t: tile t's): only the
    blocks holding keys < ctx_len are read (never past the request's row)."""
    return tl.load(bt_row + keys // block_size, mask=keys < ctx_len, other=0)


@triton.jit
def _chunk_row(blkc, t, CHUNK: tl.constexpr):
    """Row t of a chunk's blocks (tile t's), picked in registers: no memory read."""
    return tl.sum(tl.where(tl.arange(0, CHUNK)[:, None] == t, blkc, 0), 0).to(tl.int64)


@triton.jit
def _ctx_fetch(start, blk, key_lo, ctx_len, Kc, Vc, block_size, kv_head, stride_kcb, stride_kct, stride_kch,
               stride_kcd, stride_vcb, stride_vct, stride_vch, stride_vcd, kv_xg, head_dim, BLOCK_D: tl.constexpr,
               BLOCK_N: tl.constexpr, KV_VLLM: tl.constexpr, MASKED: tl.constexpr):
    """(K rows, V rows, key positions, which keys count) of the context tile at `start`, whose keys
    lie in blocks `blk`; MASKED: keys outside [key_lo, ctx_len) read as 0."""
    k_off, v_off, n, n_valid = _ctx_offsets(start, key_lo, ctx_len, blk, block_size, kv_head, stride_kcb,
                                            stride_kct, stride_kch, stride_kcd, stride_vcb, stride_vct, stride_vch,
                                            stride_vcd, kv_xg, head_dim, BLOCK_D, BLOCK_N, KV_VLLM)
    d_valid = tl.arange(0, BLOCK_D) < head_dim
    return _load_kv(Kc + k_off, n_valid, d_valid, MASKED), _load_kv(Vc + v_off, n_valid, d_valid, MASKED), n, n_valid


@triton.jit
def _lowest_key(pos, win, chunk_size, chunk_lookback, CHUNKS: tl.constexpr):
    """The lowest key position a query at `pos` sees: pos - win + 1 in a sliding window (win is
    2**31 - 1 without one), or in chunked local attention (CHUNKS binaries, chunk_size > 0) the
    first key of the chunk chunk_lookback chunks back."""
    if not CHUNKS:  # plain binaries: the window alone (the chunk test's division costs them)
        return pos - win + 1
    c = tl.maximum(chunk_size, 1)
    return tl.where(chunk_size > 0, (pos // c - chunk_lookback) * c, pos - win + 1)


@triton.jit
def _mm_pairs(q_pos, n, Mm, n_mm, mm_clamp, win):
    """[BLOCK_M, BLOCK_N]: the pairs whose query and key both lie in one of the request's
    bidirectional ranges (Mm: its n_mm inclusive (start, end) pairs; start >= end: unused), with
    mm_clamp only those inside the window."""
    pairs = (q_pos[:, None] < 0) & (n[None, :] < 0)  # all false: positions are >= 0
    for i in range(n_mm):
        start = tl.load(Mm + 2 * i)
        end = tl.load(Mm + 2 * i + 1)
        q_in = (q_pos >= start) & (q_pos <= end) & (start < end)
        pairs |= q_in[:, None] & ((n >= start) & (n <= end))[None, :]
    if mm_clamp != 0:
        pairs &= (q_pos[:, None] - n[None, :]) < win
    return pairs


@triton.jit
def _context_tile(acc, m_i, l_i, q, q_pos, start, key_lo, ctx_len, lo_row, Mm, n_mm,
                                      mm_clamp, win, Kc, Vc, bt_row,
                  block_size, kv_head,
                  stride_kcb, stride_kct, stride_kch, stride_kcd, stride_vcb, stride_vct, stride_vch, stride_vcd,
                  kv_xg, head_dim, qk_scale, ctx0, softcap, slope, alibi_mode, BLOCK_D: tl.constexpr,
                  BLOCK_N: tl.constexpr, KV_VLLM: tl.constexpr, KV_FORMAT: tl.constexpr, MASKED: tl.constexpr,
                  PTX: tl.constexpr, SCORE_MOD: tl.constexpr):
    """Keys start..start+BLOCK_N of a float or fp8 context, keys below ctx_len (the context
    length ctx0, or with kv_from_cache up to the tile's last query). Unmasked tiles lie wholly
    inside the context, before every row's query and inside every row's window, so they skip all
    key masks. lo_row: each row's lowest visible key (_lowest_key); Mm, n_mm, mm_clamp: the
    request's bidirectional ranges (_mm_pairs)."""
    blk = _ctx_blocks(start, key_lo, ctx_len, bt_row, block_size, BLOCK_N, MASKED)
    k, v, n, n_valid = _ctx_fetch(start, blk, key_lo, ctx_len, Kc, Vc, block_size, kv_head, stride_kcb, stride_kct,
                                  stride_kch, stride_kcd, stride_vcb, stride_vct, stride_vch, stride_vcd, kv_xg,
                                  head_dim, BLOCK_D, BLOCK_N, KV_VLLM, MASKED)
    if KV_FORMAT != 0:
        k = _fp8_bits_to_half(k, KV_FORMAT, PTX).to(q.dtype)
        v = _fp8_bits_to_half(v, KV_FORMAT, PTX).to(q.dtype)
    if SCORE_MOD:  # "mod" binaries alone take chunked attention and bidirectional ranges
        mask = (n[None, :] <= q_pos[:, None]) & (n[None, :] >= lo_row[:, None])
        if n_mm > 0:  # vLLM's order: (causal and window) or a bidirectional range
            mask |= _mm_pairs(q_pos, n, Mm, n_mm, mm_clamp, win)
        mask &= n_valid[None, :]
    else:  # the row bound and range branch cost plain binaries ~5% (BENCHMARKS.md, Kernel choices: masks in "mod" binaries)
        mask = n_valid[None, :] & (q_pos[:, None] - n[None, :] < win) & (n[None, :] <= q_pos[:, None])
    return _attend(acc, m_i, l_i, q, k, v, mask, qk_scale, q_pos - ctx0, n - ctx0, softcap, slope, alibi_mode,
                   MASKED, SCORE_MOD)


@triton.jit
def _new_tile(acc, m_i, l_i, q, offs_m, start, new_lo, new_hi, lo_rel, win, K, V, q_start, kv_head,
              stride_kt, stride_kh, stride_vt, stride_vh, head_dim, qk_scale, softcap, slope, alibi_mode,
              BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, SCORE_MOD: tl.constexpr):
    """New keys start..start+BLOCK_N of the request, read from K/V; unmasked tiles lie below
    the diagonal and inside every row's window. lo_rel ("mod" binaries; plain ones test win):
    each row's lowest visible key, counted from the first new token."""
    offs_d = tl.arange(0, BLOCK_D)
    n = start + tl.arange(0, BLOCK_N)
    n_valid = (n < new_hi) & (n >= new_lo)
    d_valid = offs_d < head_dim
    kv_rows = (q_start + n).to(tl.int64)
    k = _load_kv(K + (kv_rows * stride_kt + kv_head * stride_kh)[:, None] + offs_d[None, :], n_valid, d_valid,
                 MASKED)
    v = _load_kv(V + (kv_rows * stride_vt + kv_head * stride_vh)[:, None] + offs_d[None, :], n_valid, d_valid,
                 MASKED)
    if SCORE_MOD:
        mask = n_valid[None, :] & (n[None, :] <= offs_m[:, None]) & (n[None, :] >= lo_rel[:, None])
    else:
        mask = n_valid[None, :] & (n[None, :] <= offs_m[:, None]) & (offs_m[:, None] - n[None, :] < win)
    return _attend(acc, m_i, l_i, q, k, v, mask, qk_scale, offs_m, n, softcap, slope, alibi_mode, MASKED,
                   SCORE_MOD)


@triton.jit
def _float_context(acc, m_i, l_i, q, q_pos, key_lo, ctx_len, lo_row, Mm, n_mm, mm_clamp, win, first, inner_lo,
                   inner_hi, Kc, Vc, bt_row,
                   block_size, kv_head, stride_kcb, stride_kct, stride_kch, stride_kcd, stride_vcb, stride_vct,
                   stride_vch, stride_vcd, kv_xg, head_dim, qk_scale, ctx0, softcap, slope, alibi_mode,
                   BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, KV_VLLM: tl.constexpr, KV_FORMAT: tl.constexpr,
                   PTX: tl.constexpr, SCORE_MOD: tl.constexpr):
    """Cached keys [first, ctx_len) (see _context_tile); ctx0 is the context length."""
    rel_q = q_pos - ctx0
    for start in range(first, tl.minimum(inner_lo, inner_hi), BLOCK_N):
        acc, m_i, l_i = _context_tile(acc, m_i, l_i, q, q_pos, start, key_lo, ctx_len, lo_row, Mm, n_mm,
                                      mm_clamp, win, Kc, Vc, bt_row,
                                      block_size, kv_head, stride_kcb, stride_kct, stride_kch, stride_kcd,
                                      stride_vcb, stride_vct, stride_vch, stride_vcd, kv_xg, head_dim, qk_scale,
                                      ctx0, softcap, slope, alibi_mode, BLOCK_D, BLOCK_N, KV_VLLM, KV_FORMAT, True,
                                      PTX, SCORE_MOD)
    if KV_VLLM or KV_FORMAT != 0:
        # Rows that go through registers anyway (fp8 bits converted, the vllm layout gathered):
        # tile i + 1 loaded while tile i computes, its blocks read a tile earlier still. Triton
        # pipelines these loads one tile ahead only (issued after the tile's dots, waited at the top
        # of the next: the block-table read feeds their addresses). Faster for fp8 and the vllm
        # layout only (BENCHMARKS.md, Kernel choices: register prefetch).
        blk = _ctx_blocks(inner_lo, key_lo, ctx_len, bt_row, block_size, BLOCK_N, True)
        k_n, v_n, _, _ = _ctx_fetch(inner_lo, blk, key_lo, ctx_len, Kc, Vc, block_size, kv_head, stride_kcb,
                                    stride_kct, stride_kch, stride_kcd, stride_vcb, stride_vct, stride_vch, stride_vcd,
                                    kv_xg, head_dim, BLOCK_D, BLOCK_N, KV_VLLM, True)
        blk = _ctx_blocks(inner_lo + BLOCK_N, key_lo, ctx_len, bt_row, block_size, BLOCK_N, True)
        for start in range(inner_lo, inner_hi, BLOCK_N):
            k = k_n
            v = v_n
            k_n, v_n, _, _ = _ctx_fetch(start + BLOCK_N, blk, key_lo, ctx_len, Kc, Vc, block_size, kv_head,
                                        stride_kcb, stride_kct, stride_kch, stride_kcd, stride_vcb, stride_vct,
                                        stride_vch, stride_vcd, kv_xg, head_dim, BLOCK_D, BLOCK_N, KV_VLLM, True)
            blk = _ctx_blocks(start + 2 * BLOCK_N, key_lo, ctx_len, bt_row, block_size, BLOCK_N, True)
            if KV_FORMAT != 0:
                k = _fp8_bits_to_half(k, KV_FORMAT, PTX).to(q.dtype)
                v = _fp8_bits_to_half(v, KV_FORMAT, PTX).to(q.dtype)
            acc, m_i, l_i = _attend(acc, m_i, l_i, q, k, v, None, qk_scale, rel_q,
                                    start + tl.arange(0, BLOCK_N) - ctx0, softcap, slope, alibi_mode, False,
                                    SCORE_MOD)
    elif BLOCK_D <= 128:
        # Plain fp16/bf16 rows: the mask-free tiles go by chunks of CHUNK, the chunk's block ids read
        # at once (one a key, the next chunk's while this one computes) and each tile's picked in
        # registers, so inside the chunk the K/V addresses depend on no load and Triton pipelines
        # the tiles num_stages deep (TTGIR: async_wait num = 2 instead of 0). Not for d256, fp8 or
        # the vllm layout, which it slowed (BENCHMARKS.md, Kernel choices: chunked block ids).
        CHUNK: tl.constexpr = 16
        keys = inner_lo + tl.arange(0, CHUNK)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        blkc = _chunk_blocks(keys, ctx_len, bt_row, block_size)
        for c0 in range(inner_lo, inner_hi, CHUNK * BLOCK_N):
            keys += CHUNK * BLOCK_N
            blkc_next = _chunk_blocks(keys, ctx_len, bt_row, block_size)
            for t in range(0, tl.minimum(CHUNK, (inner_hi - c0) // BLOCK_N)):
                k, v, _, _ = _ctx_fetch(c0 + t * BLOCK_N, _chunk_row(blkc, t, CHUNK), key_lo, ctx_len, Kc, Vc,
                                        block_size, kv_head, stride_kcb, stride_kct, stride_kch, stride_kcd, stride_vcb,
                                        stride_vct, stride_vch, stride_vcd, kv_xg, head_dim, BLOCK_D, BLOCK_N, KV_VLLM,
                                        False)
                acc, m_i, l_i = _attend(acc, m_i, l_i, q, k, v, None, qk_scale, rel_q,
                                        c0 + t * BLOCK_N + tl.arange(0, BLOCK_N) - ctx0, softcap, slope, alibi_mode,
                                        False, SCORE_MOD)
            blkc = blkc_next
    else:
        for start in range(inner_lo, inner_hi, BLOCK_N):
            acc, m_i, l_i = _context_tile(acc, m_i, l_i, q, q_pos, start, key_lo, ctx_len, lo_row, Mm, n_mm,
                                      mm_clamp, win, Kc, Vc, bt_row,
                                          block_size, kv_head, stride_kcb, stride_kct, stride_kch, stride_kcd,
                                          stride_vcb, stride_vct, stride_vch, stride_vcd, kv_xg, head_dim, qk_scale,
                                          ctx0, softcap, slope, alibi_mode, BLOCK_D, BLOCK_N, KV_VLLM, KV_FORMAT,
                                          False, PTX, SCORE_MOD)
    for start in range(tl.maximum(inner_hi, first), ctx_len, BLOCK_N):
        acc, m_i, l_i = _context_tile(acc, m_i, l_i, q, q_pos, start, key_lo, ctx_len, lo_row, Mm, n_mm,
                                      mm_clamp, win, Kc, Vc, bt_row,
                                      block_size, kv_head, stride_kcb, stride_kct, stride_kch, stride_kcd,
                                      stride_vcb, stride_vct, stride_vch, stride_vcd, kv_xg, head_dim, qk_scale,
                                      ctx0, softcap, slope, alibi_mode, BLOCK_D, BLOCK_N, KV_VLLM, KV_FORMAT, True,
                                      PTX, SCORE_MOD)
    return acc, m_i, l_i


@triton.jit(do_not_specialize=KERNEL_DO_NOT_SPECIALIZE,
            do_not_specialize_on_alignment=KERNEL_DO_NOT_SPECIALIZE_ON_ALIGNMENT)
def prefix_prefill_kernel(
    Q, K, V, K_cache, V_cache, Out,
    Block_table, Query_start_loc, Seq_lens, K_scale, V_scale, Out_scale, Sinks,
    sm_scale, batch, num_queries_per_kv, block_size, stride_bt, window, has_sinks, out_fp8,
    skip_decode, kv_xg, scale_kind, stride_ksb, stride_kst, stride_ksh,
    head_dim, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_kcb, stride_kct, stride_kch, stride_kcd, stride_vcb, stride_vct, stride_vch, stride_vcd,
    Alibi_slopes, softcap, alibi_mode, kv_from_cache, Mm_ranges, n_mm, mm_clamp, chunk_size, chunk_lookback,
    BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    KV_VLLM: tl.constexpr, KV_FORMAT: tl.constexpr, SCALES: tl.constexpr, PTX: tl.constexpr,
    SCORE_MOD: tl.constexpr, KV_ALIGN: tl.constexpr,
):
    # Flattened q-block schedule (vLLM unified attention): request b owns programs
    # [qsl[b] // BLOCK_M + b, qsl[b+1] // BLOCK_M + b + 1), at least cdiv(len_b, BLOCK_M) of
    # them, so a grid of num_tokens // BLOCK_M + batch covers every request without reading
    # lengths on the host. Binary search for the owner: log2(batch) scalar loads.
    tl.static_assert(BLOCK_M % BLOCK_N == 0)  # the causal loop's mask-free tiles end at a q-block start
    # SCALES != 0: int8/int4, or fp8 e4m3 with per-token scales: the word tiles of quant.py
    if SCALES == 0:  # float and fp8 caches: grid (q_heads, q blocks), see below
        pid = tl.program_id(1)
        head = tl.program_id(0)
    else:
        pid = tl.program_id(0)
        head = tl.program_id(1)
    req = owner_of_block(Query_start_loc, pid, batch, BLOCK_M)  # the request owning q block pid
    q_start = tl.load(Query_start_loc + req)
    q_len = tl.load(Query_start_loc + req + 1) - q_start
    if SCALES == 0:
        # Float and fp8 caches: the heads vary fastest and a request's q blocks run last first, so
        # the blocks with the most keys (the causal part grows down the request) start first and
        # the short ones fill in behind them. The int formats keep q blocks fastest in order (two
        # programs an SM at 255 registers: this order was slower there; BENCHMARKS.md, Kernel choices: q-block order).
        rank = pid - (q_start // BLOCK_M + req)
        n_blk = tl.cdiv(q_len, BLOCK_M)
        if rank >= n_blk:
            return
        qblk = n_blk - 1 - rank
    else:
        qblk = pid - (q_start // BLOCK_M + req)
        if qblk * BLOCK_M >= q_len:
            return
    if (skip_decode != 0) & (q_len == 1):
        return
    ctx_len = tl.load(Seq_lens + req) - q_len
    kv_head = (head // num_queries_per_kv).to(tl.int64)
    win = tl.where(window > 0, window, 2147483647)

    DTYPE = Q.dtype.element_ty
    offs_m = qblk * BLOCK_M + tl.arange(0, BLOCK_M)  # new-token index within the request
    offs_d = tl.arange(0, BLOCK_D)
    m_valid = offs_m < q_len
    d_valid = offs_d < head_dim
    rows = (q_start + offs_m).to(tl.int64)
    q_row = Q + rows * stride_qt + head.to(tl.int64) * stride_qh
    if SCALES == 0:
        q = tl.load(q_row[:, None] + offs_d[None, :], mask=m_valid[:, None] & d_valid[None, :], other=0.0)

    # Sinks join the normalizer only: start the running max/sum at the sink's logit.
    sink = tl.load(Sinks + head, mask=has_sinks != 0, other=float("-inf")) * LOG2E
    m_i = tl.zeros([BLOCK_M], tl.float32) + tl.maximum(sink, NEG_BIG)
    l_i = tl.zeros([BLOCK_M], tl.float32) + tl.exp2(sink - tl.maximum(sink, NEG_BIG))

    qk_scale = sm_scale * LOG2E
    q_pos = ctx_len + offs_m  # absolute positions of this tile's queries
    last_row = tl.minimum((qblk + 1) * BLOCK_M, q_len) - 1
    lo_row = _lowest_key(q_pos, win, chunk_size, chunk_lookback, SCORE_MOD)  # each row's lowest visible key
    # Lowest absolute key position any row of this tile may see: tiles below it are skipped.
    key_lo = tl.maximum(_lowest_key(ctx_len + qblk * BLOCK_M, win, chunk_size, chunk_lookback, SCORE_MOD), 0)
    bt_row = Block_table + req.to(tl.int64) * stride_bt
    # Tiles [first, inner_lo) and [inner_hi, end) need masks; [inner_lo, inner_hi) are whole,
    # inside the context and inside the window of every row, so they run mask-free.
    inner_lo = tl.cdiv(tl.maximum(_lowest_key(ctx_len + last_row, win, chunk_size, chunk_lookback, SCORE_MOD), 0),
                       BLOCK_N) * BLOCK_N
    inner_hi = ctx_len // BLOCK_N * BLOCK_N
    # kv_from_cache: the new tokens' keys come from the cache too, after the context: keys up to
    # the tile's last query, mask-free below its first.
    ctx_hi = ctx_len
    mm_row = Mm_ranges + req.to(tl.int64) * (2 * n_mm)
    if kv_from_cache != 0:
        ctx_hi = ctx_len + last_row + 1
        inner_hi = (ctx_len + qblk * BLOCK_M) // BLOCK_N * BLOCK_N
        # Bidirectional ranges (kv_from_cache only) that hold one of the tile's queries widen its keys
        # to the range's end and down to its start (clamped: to the window's); their tiles are masked.
        if SCORE_MOD:  # "mod" binaries alone read the ranges
            for i in range(n_mm):
                start = tl.load(mm_row + 2 * i)
                end = tl.load(mm_row + 2 * i + 1)
                hit = (start < end) & (start <= ctx_len + last_row) & (end >= ctx_len + qblk * BLOCK_M)
                ctx_hi = tl.where(hit, tl.maximum(ctx_hi, tl.minimum(end + 1, ctx_len + q_len)), ctx_hi)
                # clamped: from the window's edge, which lies below the first row's chunk in chunked attention
                mm_lo = tl.where(mm_clamp != 0, tl.maximum(start, ctx_len + qblk * BLOCK_M - win + 1), start)
                key_lo = tl.where(hit, tl.maximum(tl.minimum(key_lo, mm_lo), 0), key_lo)
    first = key_lo // BLOCK_N * BLOCK_N
    inner_lo = tl.maximum(inner_lo, first)
    slope = tl.load(Alibi_slopes + head, mask=alibi_mode != 0, other=0.0)

    # ---- context from the paged cache ----
    if SCALES != 0:  # int8 / int4 codes (or fp8 with per-token scales), scales fused on the tiles (quant.py)
        if first < ctx_hi:
            acc, m_i, l_i = int_context(q_row, m_valid, head_dim, m_i, l_i, q_pos, key_lo, ctx_hi, win, first,
                                        inner_lo, inner_hi, K_cache, V_cache, bt_row, block_size, kv_head,
                                        stride_kcb, stride_kct, stride_kch, stride_vcb, stride_vct, stride_vch,
                                        K_scale, V_scale, stride_ksb, stride_kst, stride_ksh, scale_kind, qk_scale,
                                        BLOCK_M, BLOCK_D, BLOCK_N, KV_FORMAT, SCALES, PTX, KV_ALIGN)
        else:  # no context key for this tile (none cached, or all outside the window)
            # Skipping the int path outright, not only its empty loops (BENCHMARKS.md, Kernel choices: empty context).
            acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        q = tl.load(q_row[:, None] + offs_d[None, :], mask=m_valid[:, None] & d_valid[None, :], other=0.0)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        if KV_FORMAT == 0:
            Kc = K_cache.to(tl.pointer_type(DTYPE), bitcast=True)
            Vc = V_cache.to(tl.pointer_type(DTYPE), bitcast=True)
            ctx_qk_scale = qk_scale
        else:
            Kc = K_cache
            Vc = V_cache
            # e4m3 decodes as value * 2^-8 (see _fp8_bits_to_half): put the 2^8 back in the scales.
            fp8_unit = 256.0 if KV_FORMAT == 1 else 1.0
            ctx_qk_scale = qk_scale * tl.load(K_scale.to(tl.pointer_type(tl.float32), bitcast=True)) * fp8_unit
        acc, m_i, l_i = _float_context(acc, m_i, l_i, q, q_pos, key_lo, ctx_hi, lo_row, mm_row, n_mm, mm_clamp, win, first,
                                       inner_lo, inner_hi,
                                       Kc, Vc, bt_row, block_size, kv_head, stride_kcb, stride_kct, stride_kch,
                                       stride_kcd, stride_vcb, stride_vct, stride_vch, stride_vcd, kv_xg, head_dim,
                                       ctx_qk_scale, ctx_len, softcap, slope, alibi_mode, BLOCK_D, BLOCK_N, KV_VLLM,
                                       KV_FORMAT, PTX, SCORE_MOD)
        if KV_FORMAT != 0:
            # The context's V scale, applied once: later rescaling by exp2(m_old - m_new) is linear.
            acc = acc * (tl.load(V_scale.to(tl.pointer_type(tl.float32), bitcast=True)) * fp8_unit)

    # ---- the request's own new tokens, causal ----
    new_lo = tl.maximum(_lowest_key(ctx_len + qblk * BLOCK_M, win, chunk_size, chunk_lookback, SCORE_MOD) - ctx_len, 0)
    new_hi = last_row + 1
    first = new_lo // BLOCK_N * BLOCK_N
    last_lo = _lowest_key(ctx_len + last_row, win, chunk_size, chunk_lookback, SCORE_MOD) - ctx_len
    inner_lo = tl.maximum(tl.cdiv(tl.maximum(last_lo, 0), BLOCK_N) * BLOCK_N, first)
    lo_rel = lo_row - ctx_len
    inner_hi = qblk * BLOCK_M  # keys below the tile's first row: no causal mask (BLOCK_N divides BLOCK_M)
    if kv_from_cache != 0:  # read with the context above: no tile here
        first = new_hi
        inner_lo = new_hi
        inner_hi = new_hi
    for start in range(first, tl.minimum(inner_lo, inner_hi), BLOCK_N):
        acc, m_i, l_i = _new_tile(acc, m_i, l_i, q, offs_m, start, new_lo, new_hi, lo_rel, win, K, V, q_start, kv_head,
                                  stride_kt, stride_kh, stride_vt, stride_vh, head_dim, qk_scale, softcap, slope,
                                  alibi_mode, BLOCK_D, BLOCK_N, True, SCORE_MOD)
    for start in range(inner_lo, inner_hi, BLOCK_N):
        acc, m_i, l_i = _new_tile(acc, m_i, l_i, q, offs_m, start, new_lo, new_hi, lo_rel, win, K, V, q_start, kv_head,
                                  stride_kt, stride_kh, stride_vt, stride_vh, head_dim, qk_scale, softcap, slope,
                                  alibi_mode, BLOCK_D, BLOCK_N, False, SCORE_MOD)
    for start in range(tl.maximum(inner_hi, first), new_hi, BLOCK_N):
        acc, m_i, l_i = _new_tile(acc, m_i, l_i, q, offs_m, start, new_lo, new_hi, lo_rel, win, K, V, q_start, kv_head,
                                  stride_kt, stride_kh, stride_vt, stride_vh, head_dim, qk_scale, softcap, slope,
                                  alibi_mode, BLOCK_D, BLOCK_N, True, SCORE_MOD)

    # A row that saw no key and no sink has l == 0: write zeros, not NaN. (Through the op every
    # row sees at least its own key: a window w >= 1 holds distance 0.)
    o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    o_off = rows[:, None] * stride_ot + head.to(tl.int64) * stride_oh + offs_d[None, :]
    o_mask = m_valid[:, None] & d_valid[None, :]
    if out_fp8 != 0:
        o8 = _fp32_to_e4m3_bits(o / tl.load(Out_scale))
        tl.store(Out + o_off, o8.to(tl.uint8), mask=o_mask)
    else:
        tl.store(Out.to(tl.pointer_type(DTYPE), bitcast=True) + o_off, o.to(DTYPE), mask=o_mask)
