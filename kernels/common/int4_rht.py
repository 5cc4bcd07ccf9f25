"""vLLM 0.33.0's INT4_PER_TOKEN_HEAD KV cache format, in float32 torch: the randomized Hadamard
rotation (RHT), the quantization its cache writer applies, and the values a cache holds.

The format (facts from vllm/v1/attention/ops/int4_per_token_head.py; none of its code):
  - Each K/V head vector x [D] is rotated before quantization: x_rot = H_b (s * x), blockwise over
    D / b blocks of b channels, b the largest power of two dividing D (b = D for 64, 128), H_b the
    unnormalized Sylvester Hadamard matrix (H_1 = [1], H_2b = [[H, H], [H, -H]]; H_b H_b = b I) and
    s the +-1 sign vector of length b that `rht_signs` draws. x = s * H_b x_rot / b undoes it.
  - x_rot is rounded to the key's dtype, then quantized asymmetrically per (token, head): scale =
    max((max - min) / 15, 1e-6), zero point zp = clamp(round(-min / scale), 0, 15), codes n =
    clamp(round(x_rot / scale + zp), 0, 15) (round: half away from zero); value = (n - zp) * scale.
  - Codes: two a byte, channel 2i in the low nibble and 2i + 1 in the high one, cache [..., D // 2]
    uint8. Scales: one float32 word a (token, head) whose 4 low mantissa bits hold zp: scale =
    the word with those bits cleared, zp = those bits.
Attention over it: scores q.k = (H_b (s * q)) . k_rot / b, and the output is the inverse rotation
of the attention over the rotated values.

Written to be read, not to be fast.
"""
from __future__ import annotations

import torch

SIGN_SEED = 0x9E3779B9  # vLLM's seed for the rotation's sign vector (round 0)
MIN_SCALE = 1e-6


def rht_block(d: int) -> int:
    """b: the largest power of two dividing d (the rotation's block)."""
    return d & -d


def rht_signs(b: int) -> torch.Tensor:
    """The +-1 signs [b] float32 (CPU) of the rotation over blocks of b channels: a CPU generator
    seeded SIGN_SEED, one Bernoulli(0.5) draw a channel, 1 -> +1 and 0 -> -1."""
    g = torch.Generator(device="cpu")
    g.manual_seed(SIGN_SEED)
    return torch.bernoulli(torch.full((b,), 0.5, device="cpu"), generator=g) * 2.0 - 1.0


def hadamard(b: int) -> torch.Tensor:
    """The unnormalized Sylvester Hadamard matrix [b, b] float32: entry (i, j) = (-1)^popcount(i & j)."""
    i = torch.arange(b, device="cpu")  # whatever torch's default device (vLLM's tests set CUDA)
    bits = i[:, None] & i[None, :]
    parity = torch.zeros_like(bits)
    while bool(bits.any()):
        parity ^= bits & 1
        bits = bits >> 1
    return 1.0 - 2.0 * parity.float()


def rht_matrix(d: int) -> torch.Tensor:
    """R [d, d] float32 with x_rot = x @ R: block-diagonal diag(s) H_b (H_b is symmetric)."""
    b = rht_block(d)
    block = rht_signs(b)[:, None] * hadamard(b)
    return torch.block_diag(*([block] * (d // b)))


def rotate(x: torch.Tensor) -> torch.Tensor:
    """x_rot = H_b (s * x) over the last dim, float32."""
    return x.float() @ rht_matrix(x.shape[-1]).to(x.device)


def unrotate(x_rot: torch.Tensor) -> torch.Tensor:
    """The inverse of `rotate`: s * H_b x_rot / b, float32."""
    d = x_rot.shape[-1]
    return x_rot.float() @ rht_matrix(d).to(x_rot.device).T / rht_block(d)


def _round_away(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x >= 0, x + 0.5, x - 0.5).trunc()


def quantize_rotated(x_rot: torch.Tensor):
    """Asymmetric 4-bit quantization of rotated vectors x_rot [..., D] (any float dtype, read as
    float32) as vLLM's writer does it. Returns (codes [..., D] uint8 in [0, 15], scale words
    [...] float32 with the zero point in their low 4 mantissa bits)."""
    x = x_rot.float()
    lo, hi = x.amin(-1), x.amax(-1)
    scale = ((hi - lo) / 15.0).clamp_min(MIN_SCALE)
    zp = _round_away(-lo / scale).clamp(0, 15)
    codes = _round_away(x * (1.0 / scale)[..., None] + zp[..., None]).clamp(0, 15).to(torch.uint8)
    word = (scale.view(torch.int32) & -16) | zp.to(torch.int32)
    return codes, word.view(torch.float32)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """codes [..., D] in [0, 15] -> bytes [..., D // 2] uint8: channel 2i low nibble, 2i + 1 high."""
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """bytes [..., D // 2] (uint8 or int8) -> codes [..., D] int16 in [0, 15]."""
    b = packed.view(torch.uint8).to(torch.int16)
    return torch.stack([b & 0xF, b >> 4], dim=-1).flatten(-2)


def split_scale_words(words: torch.Tensor):
    """float32 scale words -> (scale float32 with the 4 low mantissa bits cleared, zero point float32)."""
    bits = words.contiguous().view(torch.int32)
    return (bits & -16).view(torch.float32), (bits & 0xF).float()


def dequantize_rotated(packed: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """The rotated values a cache holds: (n - zp) * scale, float32 [..., D], for packed bytes
    [..., D // 2] and scale words of the cache's shape without its last dim (or with a last dim 1)."""
    if words.dim() == packed.dim():
        words = words.squeeze(-1)
    scale, zp = split_scale_words(words)
    return (unpack_nibbles(packed).float() - zp[..., None]) * scale[..., None]


def dequantize(packed: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """The real (unrotated) values a cache holds, float32 [..., D]."""
    return unrotate(dequantize_rotated(packed, words))


def write(x: torch.Tensor):
    """What vLLM's writer stores for head vectors x [..., D]: (packed bytes [..., D // 2] uint8,
    scale words [...] float32). The rotation is rounded to x's dtype before quantization."""
    codes, words = quantize_rotated(rotate(x).to(x.dtype))
    return pack_nibbles(codes), words
