"""mla_decode's fused split+merge (mla_spec.FUSED: the last program of each (request, head block)
merges) on the Triton interpreter against the float32 reference, tolerances as test_kernel.py's.
Out, lse and the partials' workspace are poisoned with NaN first; the arrival counters must be
zero again after every call (the next call, and a CUDA graph replay, start from them)."""
import pytest
import torch

from aotc import loader
from aotc.kernels.decode import mla_spec as S
from aotc.loader import workspace
from aotc.loader.ops import split_merge

from .cases import assert_close, assert_lse_close, make_case

PAGE = 16
LENS = [0, 1, PAGE - 1, PAGE, PAGE + 1, 31, 32, 33, 300]  # 32-token tiles: 300 tokens span 10 of them


class _Names(list):
    """Kernel names launched, plus `kept`: the counters tensor kept between calls."""


def _poisoned(case, d_v=512):
    batch, heads = case.q.shape[:2]
    return (torch.full((batch, heads, d_v), float("nan"), dtype=case.q.dtype),
            torch.full((batch, heads), float("nan")))


def _run(case, splits, **kw):
    out, lse = _poisoned(case)
    loader.mla_decode(case.q, case.k_cache, case.table, case.seq_lens, v_head_dim=512, out=out, return_lse=True,
                      lse=lse, num_splits=splits, **kw)
    return out, lse


@pytest.fixture
def spied(monkeypatch):
    names = _Names()
    real = split_merge.run_kernel

    def spy(spec, *args, **kw):
        names.append(spec.name)
        return real(spec, *args, **kw)

    kept = {}

    def counters(device, n):
        if "t" not in kept or kept["t"].numel() < n:
            kept["t"] = torch.zeros(n, dtype=torch.int32)
        return kept["t"][:n]

    monkeypatch.setattr(split_merge, "run_kernel", spy)
    monkeypatch.setattr(workspace, "get", lambda device, n: torch.full((n,), float("nan"), device=device))
    monkeypatch.setattr(workspace, "counters", counters)
    names.kept = kept
    return names


@pytest.mark.parametrize("splits", [1, 3, S.FUSED_MAX_SPLITS])
def test_fused_block_boundaries_poisoned_twice(spied, splits):
    case = make_case(LENS, page_size=PAGE, seed=11)
    ref, ref_lse = case.reference(return_lse=True)
    first = _run(case, splits)
    assert spied == ["mla_fused"], "one launch a call"
    assert spied.kept["t"].numel() == len(LENS) and (spied.kept["t"] == 0).all(), "counters reset"
    second = _run(case, splits)
    assert (spied.kept["t"] == 0).all()
    for out, lse in (first, second):
        assert_close(out, ref, f"fused, {splits} splits")
        assert_lse_close(lse, ref_lse)
        assert (out[0] == 0).all() and (lse[0] == float("-inf")).all()  # length 0
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def test_past_the_fused_cap_two_kernels(spied):
    case = make_case([1, 700], page_size=PAGE, seed=12)
    out, lse = _run(case, S.FUSED_MAX_SPLITS + 1)
    assert spied == ["mla_split", "mla_merge"]
    ref, ref_lse = case.reference(return_lse=True)
    assert_close(out, ref, "two kernels")
    assert_lse_close(lse, ref_lse)


@pytest.mark.parametrize("tile,merge_dv", [("h32", 64), ("h64", 32)])
def test_fused_wide_tiles_merge_channel_blocks(spied, monkeypatch, tile, merge_dv):
    # the merge walks the 512 value channels in 8 (h32) or 16 (h64) blocks (h16's 128 in 4, the
    # tests above); 40 heads: a partial head block
    monkeypatch.setattr(S, "choose_tile", lambda group, arch, layout="latent": tile)
    assert S.fused_constexprs(S.split_axes("bf16", "bf16", 576, 512, "latent", tile))["MERGE_DV"] == merge_dv
    case = make_case([0, 33, 130], kv_heads=1, group=40, seed=13)
    out, lse = _run(case, 4)
    assert spied == ["mla_fused"]
    assert (spied.kept["t"] == 0).all()
    ref, ref_lse = case.reference(return_lse=True)
    assert_close(out, ref, tile)
    assert_lse_close(lse, ref_lse)


def test_fused_fp8_two_kv_heads_without_lse(spied):
    case = make_case([1, 65, 130], fmt="fp8_e4m3", kv_heads=2, group=20, seed=14)
    out, _ = _poisoned(case)
    loader.mla_decode(case.q, case.k_cache, case.table, case.seq_lens, v_head_dim=512, out=out, num_splits=5,
                      **case.kwargs)
    assert spied == ["mla_fused"]
    assert spied.kept["t"].numel() == 3 * 2 * 2 and (spied.kept["t"] == 0).all()
    assert_close(out, case.reference(), "fused fp8")


def test_fused_sinks_window_through_decode(spied):
    case = make_case([70, 9], seed=15)
    sinks = torch.tensor([0.5 * i - 3 for i in range(16)])
    out, lse = loader.decode(case.q, case.k_cache, case.k_cache[..., :512], case.table, case.seq_lens, window=40,
                             sinks=sinks, return_lse=True, num_splits=3)
    assert spied == ["mla_fused"]
    ref, ref_lse = case.reference(window=40, sinks=sinks, return_lse=True)
    assert_close(out, ref, "fused, sinks")
    assert_lse_close(lse, ref_lse)


def test_fused_spec():
    assert S.FUSED.args[:10] == S.SPLIT.args[:10] and S.FUSED.args[14:14 + len(S.SPLIT.args) - 10] == S.SPLIT.args[10:]
    assert [a.name for a in S.FUSED.args[10:14]] == ["Sinks", "Out", "Lse", "Counters"]
    assert S.FUSED.leading_ptrs == 14
    latent = [a for a in S.split_variants() if a["layout"] == "latent"]
    assert list(S.FUSED.variants()) == latent and len(latent) == 12
    axes = S.split_axes("bf16", "bf16", 576, 512, "latent", "h16")
    assert S.fuses(axes, 8) and S.fuses(axes, S.FUSED_MAX_SPLITS) and not S.fuses(axes, S.FUSED_MAX_SPLITS + 1)
    assert not S.fuses(S.split_axes("bf16", "bf16", 192, 128, "separate"), 2)
    assert S.counter_elements(32, 1, 128, "h64") == 64
    assert S.fused_constexprs(axes)["MERGE_DV"] == 128 and S.fused_constexprs(axes)["MERGE_SPLITS"] == 8
