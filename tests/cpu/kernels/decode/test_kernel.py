"""The split kernel's workspace contract, checked directly: split s of a request covers its own
chunk of tokens (BLOCK_N-rounded, from the runtime length), starts from fresh accumulators and
writes only its own slot; a split with no tokens writes lse = -inf and leaves its partial alone."""
import math

import pytest
import torch

from aotc.kernels.decode import kernel, spec as S
from aotc.kernels.decode.reference import gather_tokens

from .cases import make_case


def split_launch(case, splits, window=0):
    q, k, v = case.q, case.k_cache, case.v_cache
    batch, q_heads, head_dim = q.shape
    kv_heads = k.shape[2]
    group = q_heads // kv_heads
    part_o = torch.full((batch, q_heads, splits, head_dim), float("nan"))
    part_lse = torch.full((batch, q_heads, splits), float("nan"))
    args = [q, k, v, part_lse, part_lse, case.table, case.seq_lens, case.seq_lens, part_o, part_lse, part_lse,
            1 / math.sqrt(head_dim), window, 0, k.shape[1].bit_length() - 1, case.table.shape[1],
            case.table.stride(0), q_heads, group, S.MAX_QUANT_GROUP.bit_length() - 1, q.stride(0), q.stride(1), *k.stride()[:3], *v.stride()[:3],
            0, 0, 0, 0, 0, 0, 0.0, 0]
    axes = S.split_axes("bf16", "bf16", "fp32", head_dim)
    kernel.decode_split_kernel[S.split_grid(batch, kv_heads, group, splits)](*args, **S.SPLIT.compile_constexprs(axes, 90))
    return part_o, part_lse


@pytest.mark.parametrize("window,splits", [(0, 4), (100, 4), (0, 3), (0, 7)])
def test_each_split_owns_one_chunk(window, splits):
    # lengths around the 128-token tile: 1, block-1, block, block+1, and long (7 tiles)
    lens = [0, 1, 127, 128, 129, 300, 897]
    case = make_case(lens, fmt="bf16", kv_heads=1, group=2, seed=20)
    part_o, part_lse = split_launch(case, splits, window)
    block = S.block_n(64)
    for b, n in enumerate(lens):
        start = max(0, n - window) if window else 0
        chunk = -(-(-(-(n - start) // splits)) // block) * block
        k = gather_tokens(case.k_real, case.table[b], n).float()
        v = gather_tokens(case.v_real, case.table[b], n).float()
        for s in range(splits):
            lo, hi = start + s * chunk, min(start + (s + 1) * chunk, n)
            for h in range(2):
                if lo >= hi:
                    assert part_lse[b, h, s] == float("-inf")
                    assert part_o[b, h, s].isnan().all(), "an empty split wrote a partial"
                    continue
                scores = k[lo:hi, 0] @ case.q[b, h].float() / 8
                lse2 = torch.logsumexp(scores, 0) / math.log(2)
                assert torch.allclose(part_lse[b, h, s], lse2, atol=2e-2), (b, s, h)
                want = torch.softmax(scores, 0) @ v[lo:hi, 0]
                assert torch.allclose(part_o[b, h, s], want, atol=2e-2, rtol=2e-2), (b, s, h)
