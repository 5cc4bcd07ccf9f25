"""int8 / int4 paged context for prefix_prefill, the dequantization fused on the tiles; also fp8 e4m3
with one scale a token and kv head (vLLM's FP8_PER_TOKEN_HEAD), read as int8's words of two channels.

Formats are `decode`'s and `store_kv`'s (kernels/common/quant_reference.py): int8 codes, or int4 codes
stored as code + 7 with channel 2i in a byte's low nibble and 2i+1 in its high one; the value is
code * scale. Scales (the SCALES constexpr):
  1 token    one per token and kv head (decode's per-group format with group == head_dim), a
             tensor shaped like the cache with last dim 1, read with the cache's block/token/head
             strides;
  2 channel  one per kv head and channel, [kv_heads, D] (the Iluvatar int8 layout's scales);
  3 group    one per token, kv head and group of `group` channels (a power of two in [8, 128]:
             decode's and store_kv's per-group format), shaped like the cache with last dim
             head_dim // group; the group is runtime (quant_shift = log2(group)).
Nothing is dequantized into memory, and nothing is allocated. Words of two (int8) or four (int4)
channels go through decode's packed-PTX converters (kernels/common/dequant.py; their plain-Triton
branch where the PTX constexpr is 0, off CUDA) into fp16, split by channel: part i holds channels
NP*j + i. The dots run part by part (the parts' dots sum to the full dot), in fp16 whatever the
query dtype (BENCHMARKS.md, Kernel choices: int prefill). q is scaled by
a power of two a row into fp16's range (exact for bf16 inputs; the power goes back on that row's
scores through qk_scale) and P is rounded to fp16. The scales go where they cost least:
  token    on the K and V rows as they are dequantized: code * scale, rounded once to fp16, as
           decode does (a scale below fp16's normals, ~6.1e-5, loses precision gradually; values
           past 65504 overflow). The scales share the rows' block-table reads, and a tile loads its
           successor's; on the score and P columns instead they cost more loads and instructions
           (BENCHMARKS.md, Kernel choices: int prefill);
  group    as per token, code * scale rounded once to fp16, with a scale a run of 8 channels
           ([BLOCK_N, BLOCK_D // 8], each group's read group / 8 times in place), repeated over
           the run's words in registers; loaded a tile ahead the same way;
  token_zp int4 only (vLLM's INT4_PER_TOKEN_HEAD codes): as per token, the value (n - zp) * scale
           from one fp32 word a token (zero point in its 4 low mantissa bits);
  channel  K: on q, once per program; V: on the context's accumulator, once after the loop
           (later online-softmax rescaling is linear, as for fp8's scalar scale). The parts hold
           exact codes; int4 parts 1 and 3 come out as 16 * code (dequant._i4x4_codes16), their
           dots scaled by 1/16 in fp32, which is exact.
After the context the parts' accumulators are interleaved back into channel order for the
new-token loop.

The words themselves are left to Triton's pipelining, one tile ahead: loading them into registers
a tile ahead, as kernel.py does for fp8 and the vllm layout, was slower (BENCHMARKS.md, Kernel choices: int prefill).

Strides of the caches arrive in int16 words (the op halves the byte strides; it checks they are
even). Masking follows kernel.py: masked tiles mask keys and probabilities, so unused slots
(garbage codes, NaN scales) never reach a result.
"""
import triton
import triton.language as tl

from aotc.kernels.common.dequant import _e4m3x2_dequant, _expand, _i4x4_codes16, _i4x4_dequant, _i8x2_codes, _i8x2_dequant, _u4x4_codes16


@triton.jit
def softmax_step(qk, m_i, l_i, mask, qk_scale, MASKED: tl.constexpr, ROW_SCALE: tl.constexpr = False):
    """One online-softmax step in base 2 over fp32 scores: (p, alpha, m_new, l_new). qk_scale is a
    scalar, or with ROW_SCALE one positive value a row ([BLOCK_M])."""
    if ROW_SCALE:
        sc = qk_scale[:, None]
    else:
        sc = qk_scale
    if MASKED:
        s = tl.where(mask, qk * sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.exp2(qk * sc - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _load_scale(S, off, mask, scale_kind):
    """fp32 values of scales stored as fp32 (scale_kind 0), fp16 (1) or bf16 (2); 0 where masked."""
    if scale_kind == 0:
        s = tl.load(S.to(tl.pointer_type(tl.float32), bitcast=True) + off, mask=mask, other=0.0)
    elif scale_kind == 1:
        s = tl.load(S.to(tl.pointer_type(tl.float16), bitcast=True) + off, mask=mask, other=0.0).to(tl.float32)
    else:
        s = tl.load(S.to(tl.pointer_type(tl.bfloat16), bitcast=True) + off, mask=mask, other=0.0).to(tl.float32)
    return s


@triton.jit
def _keys(start, key_lo, ctx_len, bt_row, block_size, BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    """Key positions of a tile, which of them count, and their (block, slot)."""
    n = start + tl.arange(0, BLOCK_N)
    n_valid = (n < ctx_len) & (n >= key_lo)
    if MASKED:  # only blocks holding keys < ctx_len are read: never past the request's row
        blk = tl.load(bt_row + n // block_size, mask=n_valid, other=0).to(tl.int64)
    else:
        blk = tl.load(bt_row + n // block_size).to(tl.int64)
    return n, n_valid, blk, (n % block_size).to(tl.int64)


@triton.jit
def _words(C, blk, slot, kv_head, s_b, s_t, s_h, n_valid, n_words, BLOCK_W: tl.constexpr, MASKED: tl.constexpr,
           KV_ALIGN: tl.constexpr = 16):
    """int16 words [BLOCK_N, BLOCK_W] of the keys' rows; 0 where masked. KV_ALIGN 4: rows start
    4-byte aligned (vLLM's per-token-head record; the op checks the addresses and strides), so a
    GENERIC binary reads two words a load instead of one (and Triton can pipeline them)."""
    offs_w = tl.arange(0, BLOCK_W)
    ptrs = C + (blk * s_b + slot * s_t + kv_head * s_h)[:, None] + offs_w[None, :]
    if KV_ALIGN == 4:
        ptrs = tl.multiple_of(ptrs, [4, 4])  # bytes; on the op that makes the pointers (a parameter's hint is dropped)
    if MASKED:
        return tl.load(ptrs, mask=n_valid[:, None] & (offs_w < n_words)[None, :], other=0)
    else:
        return tl.load(ptrs, mask=(offs_w < n_words)[None, :], other=0)


@triton.jit
def _token_scales(KS, VS, blk, slot, kv_head, s_sb, s_st, s_sh, n_valid, scale_kind):
    """(K scales, V scales) [BLOCK_N] of a tile's keys, for per-token scales; 0 where masked."""
    off = blk * s_sb + slot * s_st + kv_head * s_sh
    return _load_scale(KS, off, n_valid, scale_kind), _load_scale(VS, off, n_valid, scale_kind)


@triton.jit
def _group_scales(KS, VS, blk, slot, kv_head, s_sb, s_st, s_sh, n_valid, scale_kind, quant_shift, n_runs,
                  RUNS: tl.constexpr):
    """(K scales, V scales) [BLOCK_N, RUNS] of a tile's keys for per-group scales: one a run of 8
    channels (a group holds whole runs), each group's read group / 8 times in place (L1 serves the
    repeats); 0 where masked or past head_dim."""
    runs = tl.arange(0, RUNS)
    off = (blk * s_sb + slot * s_st + kv_head * s_sh)[:, None] + ((runs * 8) >> quant_shift)[None, :]
    mask = n_valid[:, None] & (runs < n_runs)[None, :]
    return _load_scale(KS, off, mask, scale_kind), _load_scale(VS, off, mask, scale_kind)


@triton.jit
def _scales_of(start, key_lo, ctx_len, bt_row, block_size, kv_head, KS, VS, s_sb, s_st, s_sh, scale_kind,
               quant_shift, n_runs, BLOCK_N: tl.constexpr, RUNS: tl.constexpr, SCALES: tl.constexpr):
    """(K scales, V scales) of the tile at `start`: [BLOCK_N] per token, [BLOCK_N, RUNS] per group
    (_group_scales); zeros for per-channel scales. A tile loads its successor's, so their latency
    hides under a whole tile: Triton's pipelining leaves these small loads (and their block-table
    reads) synchronous (BENCHMARKS.md, Kernel choices: int prefill). Always masked (block-table reads only for keys <
    ctx_len): safe past the context."""
    if SCALES == 2:
        z = tl.zeros([BLOCK_N], tl.float32)
        return z, z
    else:
        n, n_valid, blk, slot = _keys(start, key_lo, ctx_len, bt_row, block_size, BLOCK_N, True)
        if SCALES == 1 or SCALES == 4:  # 4: the fp32 scale words, their bits kept (_i4_parts splits them)
            return _token_scales(KS, VS, blk, slot, kv_head, s_sb, s_st, s_sh, n_valid, scale_kind)
        else:
            return _group_scales(KS, VS, blk, slot, kv_head, s_sb, s_st, s_sh, n_valid, scale_kind, quant_shift,
                                 n_runs, RUNS)


@triton.jit
def _i8_parts(words, sc, SCALES: tl.constexpr, PTX: tl.constexpr, KV_FORMAT: tl.constexpr = 3):
    """fp16 parts (channels 2j, 2j + 1) of int8 words [BLOCK_N, BLOCK_W]: with per-token scales
    sc [BLOCK_N] (per-group: [BLOCK_N, runs of 8 channels]) the values code * scale (rounded once
    to fp16), else the exact codes. KV_FORMAT 1: fp8 e4m3 bytes with per-token scales (vLLM's
    FP8_PER_TOKEN_HEAD), value * scale rounded once to fp16 the same way."""
    if KV_FORMAT == 1:
        return _e4m3x2_dequant(words, tl.broadcast_to(sc.to(tl.float16)[:, None], words.shape), PTX)
    elif SCALES == 1:
        return _i8x2_dequant(words, tl.broadcast_to(sc.to(tl.float16)[:, None], words.shape), PTX)
    elif SCALES == 3:
        return _i8x2_dequant(words, _expand(sc.to(tl.float16), words.shape[0], words.shape[1]), PTX)
    else:
        return _i8x2_codes(words, PTX)


@triton.jit
def _i4_parts(words, sc, SCALES: tl.constexpr, PTX: tl.constexpr):
    """fp16 parts (channels 4j + i) of int4 words: with per-token or per-group scales the values
    code * scale, else the codes with parts 1 and 3 times 16 (_i4x4_codes16). SCALES 4 (int4_zp):
    unsigned nibbles n and one fp32 word a token, its 4 low mantissa bits the zero point zp and the
    rest the scale: (n - zp) * scale, rounded once to fp16 as per token."""
    if SCALES == 4:
        bits = sc.to(tl.int32, bitcast=True)
        s = (bits & -16).to(tl.float32, bitcast=True)[:, None]
        z = (bits & 15).to(tl.float32)[:, None]
        c0, c1, c2, c3 = _u4x4_codes16(words, PTX)  # parts 1, 3: 16 n
        return ((c0.to(tl.float32) - z) * s).to(tl.float16), ((c1.to(tl.float32) * 0.0625 - z) * s).to(tl.float16), \
            ((c2.to(tl.float32) - z) * s).to(tl.float16), ((c3.to(tl.float32) * 0.0625 - z) * s).to(tl.float16)
    elif SCALES == 1:
        return _i4x4_dequant(words, tl.broadcast_to(sc.to(tl.float16)[:, None], words.shape), PTX)
    elif SCALES == 3:
        return _i4x4_dequant(words, _expand(sc.to(tl.float16), words.shape[0], words.shape[1]), PTX)
    else:
        return _i4x4_codes16(words, PTX)


@triton.jit
def _q_part(q_row, m_valid, offs_w, w_valid, i: tl.constexpr, NP: tl.constexpr, KS, kv_head, s_sh, scale_kind,
            SCALES: tl.constexpr):
    """Query channels NP*j + i in fp32, times the K channel scales for per-channel caches."""
    d = offs_w * NP + i
    q = tl.load(q_row[:, None] + d[None, :], mask=m_valid[:, None] & w_valid[None, :], other=0.0).to(tl.float32)
    if SCALES == 2:
        q = q * _load_scale(KS, kv_head * s_sh + d, w_valid, scale_kind)[None, :]
    return q


@triton.jit
def _row_unit(amax):
    """A power of two a row putting the row's largest |q| in [2^14, 2^15): q / unit is exact in
    fp16 (bf16's 8-bit mantissa fits in fp16's 11, and nothing overflows), whatever the input
    dtype; 1 for an all-zero row. A NaN/inf row stays NaN (its output is NaN either way)."""
    return tl.where(amax > 0.0, tl.exp2(tl.floor(tl.log2(tl.maximum(amax, 1e-30))) - 14.0), 1.0)


@triton.jit
def _fp16_rows(q, unit):
    return (q / unit[:, None]).to(tl.float16)


@triton.jit
def _v_channel_scale(a, i: tl.constexpr, NP: tl.constexpr, VS, kv_head, s_sh, scale_kind, n_words,
                     BLOCK_W: tl.constexpr):
    offs_w = tl.arange(0, BLOCK_W)
    return a * _load_scale(VS, kv_head * s_sh + offs_w * NP + i, offs_w < n_words, scale_kind)[None, :]


@triton.jit
def _i8_tile(a0, a1, m_i, l_i, ksc, vsc, q0, q1, q_pos, start, key_lo, ctx_len, win, Kw, Vw, bt_row, block_size,
             kv_head, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, KS, VS, s_sb, s_st, s_sh, scale_kind, quant_shift, n_runs,
             n_words, qk_scale, BLOCK_W: tl.constexpr, BLOCK_N: tl.constexpr, SCALES: tl.constexpr,
             MASKED: tl.constexpr, PTX: tl.constexpr, KV_ALIGN: tl.constexpr, KV_FORMAT: tl.constexpr):
    RUNS: tl.constexpr = BLOCK_W // 4  # runs of 8 channels: 4 words of two
    n, n_valid, blk, slot = _keys(start, key_lo, ctx_len, bt_row, block_size, BLOCK_N, MASKED)
    ksc_next, vsc_next = _scales_of(start + BLOCK_N, key_lo, ctx_len, bt_row, block_size, kv_head, KS, VS, s_sb,
                                    s_st, s_sh, scale_kind, quant_shift, n_runs, BLOCK_N, RUNS, SCALES)
    k0, k1 = _i8_parts(_words(Kw, blk, slot, kv_head, s_kb, s_kt, s_kh, n_valid, n_words, BLOCK_W, MASKED, KV_ALIGN),
                       ksc, SCALES, PTX, KV_FORMAT)
    qk = tl.dot(q1, tl.trans(k1), acc=tl.dot(q0, tl.trans(k0)))
    mask = n_valid[None, :] & (q_pos[:, None] - n[None, :] < win) & (n[None, :] <= q_pos[:, None])
    p, alpha, m_i, l_i = softmax_step(qk, m_i, l_i, mask, qk_scale, MASKED, True)
    v0, v1 = _i8_parts(_words(Vw, blk, slot, kv_head, s_vb, s_vt, s_vh, n_valid, n_words, BLOCK_W, MASKED, KV_ALIGN),
                       vsc, SCALES, PTX, KV_FORMAT)
    p = p.to(tl.float16)
    a0 = tl.dot(p, v0, acc=a0 * alpha[:, None])
    a1 = tl.dot(p, v1, acc=a1 * alpha[:, None])
    return a0, a1, m_i, l_i, ksc_next, vsc_next


@triton.jit
def _i4_tile(a0, a1, a2, a3, m_i, l_i, ksc, vsc, q0, q1, q2, q3, q_pos, start, key_lo, ctx_len, win, Kw, Vw,
             bt_row, block_size, kv_head, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, KS, VS, s_sb, s_st, s_sh, scale_kind,
             quant_shift, n_runs, n_words, qk_scale, BLOCK_W: tl.constexpr, BLOCK_N: tl.constexpr,
             SCALES: tl.constexpr, MASKED: tl.constexpr, PTX: tl.constexpr):
    RUNS: tl.constexpr = BLOCK_W // 2  # runs of 8 channels: 2 words of four
    n, n_valid, blk, slot = _keys(start, key_lo, ctx_len, bt_row, block_size, BLOCK_N, MASKED)
    ksc_next, vsc_next = _scales_of(start + BLOCK_N, key_lo, ctx_len, bt_row, block_size, kv_head, KS, VS, s_sb,
                                    s_st, s_sh, scale_kind, quant_shift, n_runs, BLOCK_N, RUNS, SCALES)
    k0, k1, k2, k3 = _i4_parts(_words(Kw, blk, slot, kv_head, s_kb, s_kt, s_kh, n_valid, n_words, BLOCK_W,
                                      MASKED), ksc, SCALES, PTX)
    even = tl.dot(q2, tl.trans(k2), acc=tl.dot(q0, tl.trans(k0)))
    odd = tl.dot(q3, tl.trans(k3), acc=tl.dot(q1, tl.trans(k1)))
    if SCALES == 2:
        qk = even + odd * 0.0625  # per channel, parts 1 and 3 are 16 x code
    else:
        qk = even + odd
    mask = n_valid[None, :] & (q_pos[:, None] - n[None, :] < win) & (n[None, :] <= q_pos[:, None])
    p, alpha, m_i, l_i = softmax_step(qk, m_i, l_i, mask, qk_scale, MASKED, True)
    v0, v1, v2, v3 = _i4_parts(_words(Vw, blk, slot, kv_head, s_vb, s_vt, s_vh, n_valid, n_words, BLOCK_W,
                                      MASKED), vsc, SCALES, PTX)
    p = p.to(tl.float16)
    a0 = tl.dot(p, v0, acc=a0 * alpha[:, None])
    a1 = tl.dot(p, v1, acc=a1 * alpha[:, None])  # per channel 16x: undone after the context
    a2 = tl.dot(p, v2, acc=a2 * alpha[:, None])
    a3 = tl.dot(p, v3, acc=a3 * alpha[:, None])
    return a0, a1, a2, a3, m_i, l_i, ksc_next, vsc_next


@triton.jit
def _int8_context(q_row, m_valid, head_dim, m_i, l_i, q_pos, key_lo, ctx_len, win, first, inner_lo, inner_hi,
                  Kw, Vw, bt_row, block_size, kv_head, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, KS, VS, s_sb, s_st, s_sh,
                  scale_kind, quant_shift, qk_scale, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_N: tl.constexpr, SCALES: tl.constexpr, PTX: tl.constexpr, KV_ALIGN: tl.constexpr,
                  KV_FORMAT: tl.constexpr):
    BLOCK_W: tl.constexpr = BLOCK_D // 2
    RUNS: tl.constexpr = BLOCK_D // 8
    n_runs = head_dim // 8
    if KV_ALIGN == 4:  # n_words a multiple of 4 to the compiler: the word mask holds over pairs, 4-byte loads
        n_words = n_runs * 4
    else:
        n_words = head_dim // 2
    offs_w = tl.arange(0, BLOCK_W)
    w_valid = offs_w < n_words
    q0 = _q_part(q_row, m_valid, offs_w, w_valid, 0, 2, KS, kv_head, s_sh, scale_kind, SCALES)
    q1 = _q_part(q_row, m_valid, offs_w, w_valid, 1, 2, KS, kv_head, s_sh, scale_kind, SCALES)
    unit = _row_unit(tl.maximum(tl.max(tl.abs(q0), 1), tl.max(tl.abs(q1), 1)))
    q0 = _fp16_rows(q0, unit)
    q1 = _fp16_rows(q1, unit)
    qk_scale = qk_scale * unit
    a0 = tl.zeros([BLOCK_M, BLOCK_W], tl.float32)
    a1 = tl.zeros([BLOCK_M, BLOCK_W], tl.float32)
    ksc, vsc = _scales_of(first, key_lo, ctx_len, bt_row, block_size, kv_head, KS, VS, s_sb, s_st, s_sh, scale_kind,
                          quant_shift, n_runs, BLOCK_N, RUNS, SCALES)
    for start in range(first, tl.minimum(inner_lo, inner_hi), BLOCK_N):
        a0, a1, m_i, l_i, ksc, vsc = _i8_tile(a0, a1, m_i, l_i, ksc, vsc, q0, q1, q_pos, start, key_lo, ctx_len, win,
                                              Kw, Vw, bt_row, block_size, kv_head, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh,
                                              KS, VS, s_sb, s_st, s_sh, scale_kind, quant_shift, n_runs, n_words,
                                              qk_scale, BLOCK_W, BLOCK_N, SCALES, True, PTX, KV_ALIGN,
                                              KV_FORMAT)
    ksc, vsc = _scales_of(inner_lo, key_lo, ctx_len, bt_row, block_size, kv_head, KS, VS, s_sb, s_st, s_sh,
                          scale_kind, quant_shift, n_runs, BLOCK_N, RUNS, SCALES)
    for start in range(inner_lo, inner_hi, BLOCK_N):
        a0, a1, m_i, l_i, ksc, vsc = _i8_tile(a0, a1, m_i, l_i, ksc, vsc, q0, q1, q_pos, start, key_lo, ctx_len, win,
                                              Kw, Vw, bt_row, block_size, kv_head, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh,
                                              KS, VS, s_sb, s_st, s_sh, scale_kind, quant_shift, n_runs, n_words,
                                              qk_scale, BLOCK_W, BLOCK_N, SCALES, False, PTX, KV_ALIGN,
                                              KV_FORMAT)
    ksc, vsc = _scales_of(tl.maximum(inner_hi, first), key_lo, ctx_len, bt_row, block_size, kv_head, KS, VS, s_sb,
                          s_st, s_sh, scale_kind, quant_shift, n_runs, BLOCK_N, RUNS, SCALES)
    for start in range(tl.maximum(inner_hi, first), ctx_len, BLOCK_N):
        a0, a1, m_i, l_i, ksc, vsc = _i8_tile(a0, a1, m_i, l_i, ksc, vsc, q0, q1, q_pos, start, key_lo, ctx_len, win,
                                              Kw, Vw, bt_row, block_size, kv_head, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh,
                                              KS, VS, s_sb, s_st, s_sh, scale_kind, quant_shift, n_runs, n_words,
                                              qk_scale, BLOCK_W, BLOCK_N, SCALES, True, PTX, KV_ALIGN,
                                              KV_FORMAT)
    if SCALES == 2:
        a0 = _v_channel_scale(a0, 0, 2, VS, kv_head, s_sh, scale_kind, n_words, BLOCK_W)
        a1 = _v_channel_scale(a1, 1, 2, VS, kv_head, s_sh, scale_kind, n_words, BLOCK_W)
    return tl.interleave(a0, a1), m_i, l_i


@triton.jit
def _int4_context(q_row, m_valid, head_dim, m_i, l_i, q_pos, key_lo, ctx_len, win, first, inner_lo, inner_hi,
                  Kw, Vw, bt_row, block_size, kv_head, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, KS, VS, s_sb, s_st, s_sh,
                  scale_kind, quant_shift, qk_scale, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_N: tl.constexpr, SCALES: tl.constexpr, PTX: tl.constexpr):
    BLOCK_W: tl.constexpr = BLOCK_D // 4
    RUNS: tl.constexpr = BLOCK_D // 8
    n_words = head_dim // 4
    n_runs = head_dim // 8
    offs_w = tl.arange(0, BLOCK_W)
    w_valid = offs_w < n_words
    q0 = _q_part(q_row, m_valid, offs_w, w_valid, 0, 4, KS, kv_head, s_sh, scale_kind, SCALES)
    q1 = _q_part(q_row, m_valid, offs_w, w_valid, 1, 4, KS, kv_head, s_sh, scale_kind, SCALES)
    q2 = _q_part(q_row, m_valid, offs_w, w_valid, 2, 4, KS, kv_head, s_sh, scale_kind, SCALES)
    q3 = _q_part(q_row, m_valid, offs_w, w_valid, 3, 4, KS, kv_head, s_sh, scale_kind, SCALES)
    unit = _row_unit(tl.maximum(tl.maximum(tl.max(tl.abs(q0), 1), tl.max(tl.abs(q1), 1)),
                                tl.maximum(tl.max(tl.abs(q2), 1), tl.max(tl.abs(q3), 1))))
    q0 = _fp16_rows(q0, unit)
    q1 = _fp16_rows(q1, unit)
    q2 = _fp16_rows(q2, unit)
    q3 = _fp16_rows(q3, unit)
    qk_scale = qk_scale * unit
    a0 = tl.zeros([BLOCK_M, BLOCK_W], tl.float32)
    a1 = tl.zeros([BLOCK_M, BLOCK_W], tl.float32)
    a2 = tl.zeros([BLOCK_M, BLOCK_W], tl.float32)
    a3 = tl.zeros([BLOCK_M, BLOCK_W], tl.float32)
    ksc, vsc = _scales_of(first, key_lo, ctx_len, bt_row, block_size, kv_head, KS, VS, s_sb, s_st, s_sh, scale_kind,
                          quant_shift, n_runs, BLOCK_N, RUNS, SCALES)
    for start in range(first, tl.minimum(inner_lo, inner_hi), BLOCK_N):
        a0, a1, a2, a3, m_i, l_i, ksc, vsc = _i4_tile(a0, a1, a2, a3, m_i, l_i, ksc, vsc, q0, q1, q2, q3, q_pos,
                                                      start, key_lo, ctx_len, win, Kw, Vw, bt_row, block_size,
                                                      kv_head, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, KS, VS, s_sb, s_st,
                                                      s_sh, scale_kind, quant_shift, n_runs, n_words, qk_scale,
                                                      BLOCK_W, BLOCK_N, SCALES, True, PTX)
    ksc, vsc = _scales_of(inner_lo, key_lo, ctx_len, bt_row, block_size, kv_head, KS, VS, s_sb, s_st, s_sh,
                          scale_kind, quant_shift, n_runs, BLOCK_N, RUNS, SCALES)
    for start in range(inner_lo, inner_hi, BLOCK_N):
        a0, a1, a2, a3, m_i, l_i, ksc, vsc = _i4_tile(a0, a1, a2, a3, m_i, l_i, ksc, vsc, q0, q1, q2, q3, q_pos,
                                                      start, key_lo, ctx_len, win, Kw, Vw, bt_row, block_size,
                                                      kv_head, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, KS, VS, s_sb, s_st,
                                                      s_sh, scale_kind, quant_shift, n_runs, n_words, qk_scale,
                                                      BLOCK_W, BLOCK_N, SCALES, False, PTX)
    ksc, vsc = _scales_of(tl.maximum(inner_hi, first), key_lo, ctx_len, bt_row, block_size, kv_head, KS, VS, s_sb,
                          s_st, s_sh, scale_kind, quant_shift, n_runs, BLOCK_N, RUNS, SCALES)
    for start in range(tl.maximum(inner_hi, first), ctx_len, BLOCK_N):
        a0, a1, a2, a3, m_i, l_i, ksc, vsc = _i4_tile(a0, a1, a2, a3, m_i, l_i, ksc, vsc, q0, q1, q2, q3, q_pos,
                                                      start, key_lo, ctx_len, win, Kw, Vw, bt_row, block_size,
                                                      kv_head, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, KS, VS, s_sb, s_st,
                                                      s_sh, scale_kind, quant_shift, n_runs, n_words, qk_scale,
                                                      BLOCK_W, BLOCK_N, SCALES, True, PTX)
    if SCALES == 2:
        a1 = a1 * 0.0625
        a3 = a3 * 0.0625
        a0 = _v_channel_scale(a0, 0, 4, VS, kv_head, s_sh, scale_kind, n_words, BLOCK_W)
        a1 = _v_channel_scale(a1, 1, 4, VS, kv_head, s_sh, scale_kind, n_words, BLOCK_W)
        a2 = _v_channel_scale(a2, 2, 4, VS, kv_head, s_sh, scale_kind, n_words, BLOCK_W)
        a3 = _v_channel_scale(a3, 3, 4, VS, kv_head, s_sh, scale_kind, n_words, BLOCK_W)
    return tl.interleave(tl.interleave(a0, a2), tl.interleave(a1, a3)), m_i, l_i


@triton.jit
def int_context(q_row, m_valid, head_dim, m_i, l_i, q_pos, key_lo, ctx_len, win, first, inner_lo, inner_hi,
                K_cache, V_cache, bt_row, block_size, kv_head, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, KS, VS,
                s_sb, s_st, s_sh, scale_kind, qk_scale, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_N: tl.constexpr, KV_FORMAT: tl.constexpr, SCALES: tl.constexpr, PTX: tl.constexpr,
                KV_ALIGN: tl.constexpr = 16):
    """(acc [BLOCK_M, BLOCK_D] fp32 in channel order, m_i, l_i) over the context of an int8
    (KV_FORMAT 3), int4 (4) or, with per-token scales, fp8 e4m3 (1) cache: keys below ctx_len (with kv_from_cache the new tokens' too,
    causal: masked tiles hold no key past a row's query); tile ranges as in kernel.py. scale_kind: the scales' dtype
    (_load_scale), with per-group scales log2(group) above it (scale_kind >> 2): packed into one
    argument, because one more kernel parameter moved ptxas's register allocation of the other
    variants, which sit at 255 registers (it added spills)."""
    if SCALES == 3:
        quant_shift = scale_kind >> 2
        scale_kind = scale_kind & 3
    else:
        quant_shift = 0
    Kw = K_cache.to(tl.pointer_type(tl.int16), bitcast=True)
    Vw = V_cache.to(tl.pointer_type(tl.int16), bitcast=True)
    if KV_FORMAT == 3 or KV_FORMAT == 1:  # 1: fp8 e4m3 with per-token scales, as int8 words of two
        return _int8_context(q_row, m_valid, head_dim, m_i, l_i, q_pos, key_lo, ctx_len, win, first, inner_lo,
                             inner_hi, Kw, Vw, bt_row, block_size, kv_head, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, KS, VS,
                             s_sb, s_st, s_sh, scale_kind, quant_shift, qk_scale, BLOCK_M, BLOCK_D, BLOCK_N, SCALES,
                             PTX, KV_ALIGN, KV_FORMAT)
    else:
        return _int4_context(q_row, m_valid, head_dim, m_i, l_i, q_pos, key_lo, ctx_len, win, first, inner_lo,
                             inner_hi, Kw, Vw, bt_row, block_size, kv_head, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, KS, VS,
                             s_sb, s_st, s_sh, scale_kind, quant_shift, qk_scale, BLOCK_M, BLOCK_D, BLOCK_N, SCALES,
                             PTX)
