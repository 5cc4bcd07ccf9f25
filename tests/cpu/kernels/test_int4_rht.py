"""The float32 reference of vLLM's INT4_PER_TOKEN_HEAD format (kernels/common/int4_rht.py) against
an independent re-derivation: a butterfly Walsh-Hadamard transform, bytes and float words decoded
one at a time in Python (struct), and the quantization error bound of its writer.

Tolerances: rotations 1e-5 relative (float32 sums of 128 terms); decoded values exact (1e-6);
round trip: each rotated value within half a quantization step (plus 1e-4 of it for the scale's
4 cleared mantissa bits) of the written one."""
import struct

import pytest
import torch

from aotc.kernels.common import int4_rht as F


def butterfly(x):
    """Unnormalized Walsh-Hadamard transform over the last dim (natural order), by butterflies."""
    x = x.clone().float()
    d, h = x.shape[-1], 1
    while h < d:
        y = x.view(*x.shape[:-1], d // (2 * h), 2, h)
        a, b = y[..., 0, :].clone(), y[..., 1, :].clone()
        y[..., 0, :], y[..., 1, :] = a + b, a - b
        h *= 2
    return x


def rotate_by_blocks(x):
    d = x.shape[-1]
    b = d & -d
    s = F.rht_signs(b)
    return butterfly((x.float().unflatten(-1, (d // b, b))) * s).flatten(-2)


def test_signs_are_plus_minus_one_and_seeded():
    s = F.rht_signs(128)
    assert set(s.tolist()) == {-1.0, 1.0}
    assert torch.equal(s[:64], F.rht_signs(64))  # one Bernoulli stream: a prefix of the longer draw
    assert 40 < int((s > 0).sum()) < 88


@pytest.mark.parametrize("d", [64, 96, 128, 80])
def test_rotation_matches_butterfly_and_inverts(d):
    x = torch.randn(5, 3, d, generator=torch.Generator().manual_seed(d)) * 3
    rot = F.rotate(x)
    torch.testing.assert_close(rot, rotate_by_blocks(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(F.unrotate(rot), x, rtol=1e-5, atol=1e-5)
    b = d & -d
    torch.testing.assert_close(rot.norm(dim=-1), x.norm(dim=-1) * b ** 0.5, rtol=1e-5, atol=1e-5)


def _decode_by_hand(packed, words):
    """(n - zp) * scale, one byte and one float word at a time."""
    out = torch.empty(*packed.shape[:-1], packed.shape[-1] * 2)
    for idx in torch.cartesian_prod(*[torch.arange(n) for n in packed.shape[:-1]]).tolist():
        idx = tuple(idx) if isinstance(idx, list) else (idx,)
        bits = struct.unpack("<I", struct.pack("<f", float(words[idx])))[0]
        zp = bits & 0xF
        scale = struct.unpack("<f", struct.pack("<I", bits & ~0xF))[0]
        for j, byte in enumerate(packed[idx].view(torch.uint8).tolist()):
            out[idx + (2 * j,)] = ((byte & 0xF) - zp) * scale
            out[idx + (2 * j + 1,)] = ((byte >> 4) - zp) * scale
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("d", [64, 128])
def test_writer_round_trip(dtype, d):
    g = torch.Generator().manual_seed(d + 3)
    x = (torch.randn(4, 2, d, generator=g) * torch.rand(4, 2, 1, generator=g) * 4).to(dtype)
    x[0, 0] = 0.0  # an all-zero vector: the 1e-6 scale floor
    x[1, 1, 3] = 50.0  # an outlier the rotation spreads
    packed, words = F.write(x)
    assert packed.dtype == torch.uint8 and packed.shape == (4, 2, d // 2)
    assert words.dtype == torch.float32 and words.shape == (4, 2)
    by_hand = _decode_by_hand(packed, words)
    torch.testing.assert_close(F.dequantize_rotated(packed, words), by_hand, rtol=0, atol=1e-6)
    torch.testing.assert_close(F.dequantize_rotated(packed, words[..., None]), by_hand, rtol=0, atol=1e-6)
    rot = rotate_by_blocks(x.float()).to(dtype).float()
    scale, zp = F.split_scale_words(words)
    assert bool(((zp >= 0) & (zp <= 15) & (zp == zp.round())).all())
    step = ((rot.amax(-1) - rot.amin(-1)) / 15).clamp_min(1e-6)
    assert bool(((by_hand - rot).abs() <= step[..., None] * (0.5 + 1e-4) + 1e-7).all())
    torch.testing.assert_close(scale, step, rtol=2e-6, atol=0)  # the stored scale: 4 mantissa bits cleared
    # the real values: the inverse rotation of the decoded ones
    d_b = d & -d
    want = (butterfly(by_hand.unflatten(-1, (d // d_b, d_b))) * F.rht_signs(d_b) / d_b).flatten(-2)
    torch.testing.assert_close(F.dequantize(packed, words), want, rtol=1e-5, atol=1e-5)
    assert float((F.dequantize(packed, words) - x.float()).abs().max()) < 0.35 * float(x.float().abs().max() + 1)


def test_nibble_order():
    codes = torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8)
    packed = F.pack_nibbles(codes)
    assert packed.tolist() == [[0x21, 0x0F]]
    assert F.unpack_nibbles(packed).tolist() == [[1, 2, 15, 0]]


def test_matrices_are_built_on_the_cpu_under_another_default_device():
    # vLLM's tests set torch's default device to CUDA; the seeded CPU generator must still draw the signs
    want = F.rht_matrix(128)
    with torch.device("meta"):
        got = F.rht_matrix(128)
    assert got.device.type == "cpu" and torch.equal(got, want)
