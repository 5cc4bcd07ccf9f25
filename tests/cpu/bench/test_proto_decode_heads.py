"""bench/proto_decode_heads.py (the several-KV-heads-a-program prototypes) computes decode's
attention: against the float32 reference at block boundaries, token- and head-major caches,
NaN-poisoned outputs, under the interpreter."""
import sys
from pathlib import Path

import pytest
import torch

from aotc.kernels.decode.reference import decode_reference, dequantize, pack_int4, quantize_reference
from aotc.loader.interpreter import patch_interpreter

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
patch_interpreter()

import proto_decode_heads as P  # noqa: E402


def _inputs(fmt, lens, page, kv_heads=4, group=2, hd=64, head_major=False, seed=0):
    torch.manual_seed(seed)
    batch = len(lens)
    max_pages = -(-max(lens) // page) + 1
    pages = batch * max_pages + 3
    q = torch.randn(batch, kv_heads * group, hd).to(torch.bfloat16)
    shape = (pages, kv_heads, page, hd) if head_major else (pages, page, kv_heads, hd)
    caches = []
    for _ in range(2):
        codes, scales = quantize_reference(torch.randn(shape), fmt, hd, torch.bfloat16)
        if fmt == "int4":
            codes = pack_int4(codes)
        if head_major:
            codes, scales = codes.transpose(1, 2), scales.transpose(1, 2)
        caches.append((codes, scales))
    table = torch.randperm(pages, dtype=torch.int32)[: batch * max_pages].view(batch, max_pages).contiguous()
    return q, caches, table, torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("diag", [False, True])
@pytest.mark.parametrize("heads,block_n,splits,head_major,group", [(2, 16, 1, False, 2), (4, 16, 3, True, 2),
                                                                  (2, 32, 2, True, 4), (1, 16, 2, False, 2),
                                                                  (4, 16, 2, False, 4)])
def test_matches_reference(fmt, diag, heads, block_n, splits, head_major, group):
    # lengths at block boundaries: 1, block - 1, block, block + 1, and a longer one; 0 gives zeros
    lens = [1, block_n - 1, block_n, block_n + 1, 3 * block_n + 5, 0]
    q, ((kc, ks), (vc, vs)), table, seq_lens = _inputs(fmt, lens, page=8, head_major=head_major, group=group)
    out = torch.full_like(q, float("nan"))
    P.decode_heads(q, kc, vc, ks, vs, table, seq_lens, fmt, heads, splits, block_n, out=out, ptx=False, diag=diag)
    ref = decode_reference(q.float(), dequantize(kc, fmt, ks), dequantize(vc, fmt, vs), table, seq_lens)
    assert not out.isnan().any()
    err = (out.float() - ref).norm() / ref.norm()
    assert err < 1e-2, err  # bf16 output, fp16 probabilities
    assert (out[-1] == 0).all()
