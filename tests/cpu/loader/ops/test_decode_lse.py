"""decode(return_lse=True) on CPU tensors (interpreter) against the float32 reference's LSE.

lse is the natural-log log-sum-exp of the scaled scores over the attended tokens (the window's)
plus the sink: tolerance 2e-3 + 1e-3 |ref| per element (the scores' own rounding: q and K in
fp16/bf16 dots, int4 codes with a bias removed), every element; -inf exactly where nothing was
attended. Outputs are poisoned with NaN first.
"""
import math

import pytest
import torch

from aotc.kernels.decode import spec as S
from aotc.loader.ops.decode import decode
from tests.cpu.kernels.decode.cases import assert_close, make_case


def assert_lse(lse, ref, what=""):
    assert lse.dtype == torch.float32 and lse.shape == ref.shape
    assert not lse.isnan().any(), f"{what}: NaN in lse"
    empty = ref == float("-inf")
    assert torch.equal(lse == float("-inf"), empty), f"{what}: -inf where nothing was attended, only there"
    err = (lse[~empty] - ref[~empty]).abs()
    bound = 2e-3 + 1e-3 * ref[~empty].abs()
    assert (err <= bound).all(), f"{what}: lse error {err.max():.3g}"


def run(case, **kw):
    out = torch.full_like(case.q, float("nan"))
    lse = torch.full(case.q.shape[:2], float("nan"))
    got = decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, out=out, return_lse=True, lse=lse,
                 **case.kwargs, **kw)
    assert got[0] is out and got[1] is lse
    return out, lse


@pytest.mark.parametrize("fmt,head_dim,quant_group", [("bf16", 64, 32), ("fp16", 64, 32), ("int8", 64, 32),
                                                      ("int8", 128, 128), ("int8", 128, 64), ("int4", 64, 64),
                                                      ("int4", 128, 32), ("fp8_e4m3", 64, 32)])
def test_lse_matches_reference_at_block_edges(fmt, head_dim, quant_group):
    axes = S.split_axes(fmt if fmt in ("fp16", "bf16") else "bf16", fmt, "fp16" if fmt in ("int8", "int4") else "fp32", head_dim,
                        per_token=fmt in ("int8", "int4") and quant_group == head_dim, quant_group=quant_group)
    n = S.block_n(head_dim, S.split_tiles(fmt, head_dim, axes["scales"])[0])
    case = make_case([0, 1, n - 1, n, n + 1, 2 * n + 3], fmt=fmt, head_dim=head_dim, quant_group=quant_group,
                     kv_heads=2, group=3, seed=40)
    out, lse = run(case, num_splits=3)
    ref, ref_lse = case.reference(return_lse=True)
    assert_close(out, ref, fmt)
    assert_lse(lse, ref_lse, f"{fmt} {axes['scales']}")
    assert (lse[0] == float("-inf")).all() and (out[0] == 0).all()


def test_lse_with_window_sinks_and_req_idx():
    # LSE of what was attended: the window's tokens and the sink, so exp(lse) is the denominator
    # that out was divided by; a request of length 0 with a sink gets lse = the sink's logit.
    case = make_case([0, 5, 130, 300], fmt="bf16", req_idx=True, page_size=32, seed=41)
    sinks = torch.randn(case.q.shape[1]) * 2
    out, lse = run(case, window=100, sinks=sinks, num_splits=4)
    ref, ref_lse = case.reference(window=100, sinks=sinks, return_lse=True)
    assert_close(out, ref, "window sinks")
    assert_lse(lse, ref_lse, "window sinks")
    assert torch.allclose(lse[0], sinks, atol=1e-6)
    # Without the window the LSE covers every token: larger for the requests longer than 100.
    _, full = run(case, sinks=sinks, num_splits=4)
    assert (full[2:] > lse[2:]).all()


def test_lse_merges_two_halves_into_the_whole():
    # What cascade attention does with it: two decodes over the two halves of each sequence,
    # merged by their LSEs, equal one decode over the whole (float32 merge of bf16 outputs).
    case = make_case([40, 200, 129], fmt="fp16", page_size=16, seed=42)
    whole, whole_lse = run(case, num_splits=2)
    # first half: lengths halved (pages 0.. of the same table); second half: the last tokens by window
    first_lens = case.seq_lens // 2
    out1, lse1 = decode(case.q, case.k_cache, case.v_cache, case.table, first_lens, return_lse=True)
    rest = case.seq_lens - first_lens
    # the second half as a window over the full length (window differs per request: one call each)
    merged = torch.empty_like(whole, dtype=torch.float32)
    merged_lse = torch.empty_like(whole_lse)
    for b in range(case.q.shape[0]):
        o2, l2 = decode(case.q[b:b + 1], case.k_cache, case.v_cache, case.table[b:b + 1], case.seq_lens[b:b + 1],
                        window=int(rest[b]), return_lse=True)
        m = torch.maximum(lse1[b], l2[0])
        w1, w2 = torch.exp(lse1[b] - m), torch.exp(l2[0] - m)
        merged[b] = (out1[b].float() * w1[:, None] + o2[0].float() * w2[:, None]) / (w1 + w2)[:, None]
        merged_lse[b] = m + torch.log(w1 + w2)
    assert_close(merged.to(whole.dtype), case.reference(), "merged halves")
    assert (merged_lse - whole_lse).abs().max() < 2e-3


def test_lse_into_a_strided_view_and_allocated():
    case = make_case([3, 70], fmt="bf16", seed=43)
    h = case.q.shape[1]
    buf = torch.full((2, 2 * h), float("nan"))
    _, lse = decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, return_lse=True, lse=buf[:, :h])
    assert buf[:, h:].isnan().all()  # the other half of each row is not written
    assert_lse(lse, case.reference(return_lse=True)[1])
    out, lse2 = decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, return_lse=True)
    assert torch.equal(lse2, lse)


@pytest.mark.parametrize("lse,exc,match", [
    (torch.empty(2, 8, dtype=torch.float16), TypeError, "lse must be of dtype"),
    (torch.empty(2, 9), ValueError, "lse: shape"),
    (torch.empty(8, 2).t(), ValueError, "lse must be contiguous in its last dim"),
])
def test_bad_lse_is_refused(lse, exc, match):
    case = make_case([3, 7], fmt="bf16", seed=44)
    with pytest.raises(exc, match=match):
        decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, return_lse=True, lse=lse)


def test_lse_without_return_lse_is_refused():
    case = make_case([3], fmt="bf16", seed=45)
    with pytest.raises(ValueError, match="return_lse"):
        decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, lse=torch.empty(1, 8))


def test_reference_lse_is_the_log_of_the_softmax_denominator():
    # The reference's own definition, checked against a direct computation for one head.
    case = make_case([9], fmt="bf16", kv_heads=1, group=1, seed=46)
    _, lse = case.reference(return_lse=True, sm_scale=0.2)
    k = case.k_real[case.table[0, 0].long(), :9, 0]
    direct = torch.log(torch.exp(0.2 * (k @ case.q[0, 0].float())).sum())
    assert math.isclose(float(lse[0, 0]), float(direct), rel_tol=1e-5)
