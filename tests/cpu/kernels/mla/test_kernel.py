"""MLA / unequal-head decode on the Triton interpreter against the float32 reference
(kernels/mla/reference.py): out within cases.assert_close's tolerance (bf16 2e-2 abs + rel and
1e-2 relative Frobenius, fp16 5e-3 / 3e-3), lse within 2e-3 + 1e-3 |ref|; out and lse poisoned
with NaN first. Lengths hit the 32- and 64-token tiles' boundaries (1, 31, 32, 33, 63, 64, 65) and
the splits'."""
import pytest
import torch

from aotc import loader
from aotc.kernels.decode import mla_spec as S

from .cases import assert_close, assert_lse_close, make_case

TILE_LENS = [0, 1, 31, 32, 33, 63, 64, 65, 200]


def _poisoned(case, d_v):
    batch, heads = case.q.shape[:2]
    return (torch.full((batch, heads, d_v), float("nan"), dtype=case.q.dtype),
            torch.full((batch, heads), float("nan")))


@pytest.mark.parametrize("page_size", [1, 16])
def test_latent_bf16_block_boundaries(page_size):
    case = make_case(TILE_LENS, page_size=page_size, seed=1)
    out, lse = _poisoned(case, 512)
    loader.mla_decode(case.q, case.k_cache, case.table, case.seq_lens, v_head_dim=512, out=out, return_lse=True,
                      lse=lse, num_splits=2)
    ref, ref_lse = case.reference(return_lse=True)
    assert_close(out, ref, "latent bf16")
    assert_lse_close(lse, ref_lse)
    assert (out[0] == 0).all()  # length 0: zeros


def test_latent_fp8_e4m3_fp16_query_groups_over_one_tile():
    # 20 heads a KV head over 2 KV heads: a full and a partial 16-head block each
    case = make_case([1, 65, 130], fmt="fp16", kv_heads=2, group=20, seed=2)
    case8 = make_case([1, 65, 130], fmt="fp8_e4m3", kv_heads=2, group=20, seed=2)
    for c, what in ((case, "fp16"), (case8, "fp8")):
        out, lse = _poisoned(c, 512)
        if what == "fp8":
            c.q = c.q.to(torch.bfloat16)
            out = out.to(torch.bfloat16)
        loader.mla_decode(c.q, c.k_cache, c.table, c.seq_lens, v_head_dim=512, out=out, return_lse=True, lse=lse,
                          **c.kwargs)
        ref, ref_lse = c.reference(return_lse=True)
        assert_close(out, ref, f"latent {what}")
        assert_lse_close(lse, ref_lse)


@pytest.mark.parametrize("d_qk,d_v", [(192, 128), (128, 512), (80, 48)])
def test_separate_caches_through_decode(d_qk, d_v):
    case = make_case([3, 64, 129], d_qk=d_qk, d_v=d_v, latent=False, kv_heads=2, group=4, page_size=8, seed=3)
    out, lse = _poisoned(case, d_v)
    loader.decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, out=out, return_lse=True, lse=lse,
                  sm_scale=0.07)
    ref, ref_lse = case.reference(return_lse=True, sm_scale=0.07)
    assert_close(out, ref, f"separate {d_qk}/{d_v}")
    assert_lse_close(lse, ref_lse)


def test_separate_fp8_e5m2_with_two_scales():
    case = make_case([5, 66], d_qk=192, d_v=128, latent=False, fmt="fp8_e5m2", kv_heads=1, group=8, seed=4)
    out = loader.decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, **case.kwargs)
    assert_close(out, case.reference(), "separate fp8 e5m2")


def test_decode_reads_a_latent_view_once_and_takes_window_sinks_req_idx():
    case = make_case([70, 9], seed=5)
    sinks = torch.tensor([0.5 * i - 3 for i in range(16)])
    req_idx = torch.tensor([1, 0], dtype=torch.int32)
    table = case.table.flip(0).contiguous()  # rows swapped, req_idx swaps them back
    out, lse = loader.decode(case.q, case.k_cache, case.k_cache[..., :512], table, case.seq_lens, req_idx=req_idx,
                             window=40, sinks=sinks, return_lse=True)
    ref, ref_lse = case.reference(window=40, sinks=sinks, return_lse=True)
    assert_close(out, ref, "latent via decode")
    assert_lse_close(lse, ref_lse)


def test_equal_head_size_decode_lacks_runs_here():
    case = make_case([33, 64], d_qk=192, d_v=192, latent=False, kv_heads=1, group=4, seed=6)
    out = loader.decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens)
    assert_close(out, case.reference(), "192/192")


@pytest.mark.parametrize("tile", ["h32", "h64"])
def test_wide_tiles(tile, monkeypatch):
    # the tiles a GPU picks for 32+ and 64+ heads (choose_tile sees no GPU here)
    monkeypatch.setattr(S, "choose_tile", lambda group, arch, layout="latent": tile)
    case = make_case([1, 33, 130], kv_heads=1, group=40, seed=8)
    out, lse = _poisoned(case, 512)
    loader.mla_decode(case.q, case.k_cache, case.table, case.seq_lens, out=out, return_lse=True, lse=lse)
    ref, ref_lse = case.reference(return_lse=True)
    assert_close(out, ref, tile)
    assert_lse_close(lse, ref_lse)


def test_splits_agree():
    case = make_case([200], kv_heads=1, group=16, seed=7)
    one = loader.mla_decode(case.q, case.k_cache, case.table, case.seq_lens, num_splits=1)
    many = loader.mla_decode(case.q, case.k_cache, case.table, case.seq_lens, num_splits=4)
    assert_close(one, case.reference(), "1 split")
    assert_close(many, case.reference(), "4 splits")


def test_tile_choice():
    assert [S.choose_tile(g, 90) for g in (1, 16, 31, 32, 63, 64, 128)] == ["h16"] * 3 + ["h32"] * 2 + ["h64"] * 2
    assert S.choose_tile(128, 80) == "h32"  # no 64-head binary below sm90
    assert S.choose_tile(128, 90, "separate") == "h16"
    assert S.SPLIT.launch_config(S.split_axes("bf16", "bf16", 576, 512, "latent", "h64"), 80) is None


def test_key_blocks():
    assert S.key_blocks(576, 512, "latent") == (512, 64)
    assert S.key_blocks(576, 512, "separate") == (512, 64)
    assert S.key_blocks(192, 128, "separate") == (128, 64)
    assert S.key_blocks(128, 512, "separate") == (128, 0)
    assert S.key_blocks(400, 256, "separate") == (256, 256)
    assert S.key_blocks(80, 48, "latent") == (64, 16)


# 65, 256: the wide merge (one 256-split tile over channel blocks); 257:
# the looping merge, a partial fifth step
@pytest.mark.parametrize("splits", [65, 256, 257])
def test_many_splits_merge_on_a_poisoned_workspace(monkeypatch, splits):
    """Past 64 splits; most splits of these lengths are empty and their slots, poisoned with NaN,
    must not reach the output (32-token tiles: 200 tokens take 7 splits)."""
    from aotc.loader import workspace

    monkeypatch.setattr(workspace, "get", lambda device, n: torch.full((n,), float("nan"), device=device))
    case = make_case(TILE_LENS + [2100], kv_heads=1, group=16, seed=9)
    out, lse = _poisoned(case, 512)
    loader.mla_decode(case.q, case.k_cache, case.table, case.seq_lens, out=out, return_lse=True, lse=lse,
                      num_splits=splits)
    ref, ref_lse = case.reference(return_lse=True)
    assert_close(out, ref, f"{splits} splits")
    assert_lse_close(lse, ref_lse)


@pytest.mark.parametrize("cap", [S.RULE_MAX_SPLITS, S.PAGE_AHEAD_MAX_SPLITS])
@pytest.mark.parametrize("per_sm", [None, 1, 2, 4])
@pytest.mark.parametrize("batch", [1, 2, 7, 32, 128, 1024])
@pytest.mark.parametrize("group,tile", [(16, "h16"), (128, "h64"), (32, "h32")])
def test_split_rule_keeps_one_wave_and_its_cap(batch, group, tile, per_sm, cap):
    sms = 132
    splits = S.num_splits(batch, 1, group, tile, sms, per_sm, cap)
    slots = (per_sm or 4) * sms
    programs = batch * S.head_blocks(group, tile)
    assert 1 <= splits <= cap
    assert programs * splits <= max(programs, slots), "a second wave"
    assert splits == cap or programs * (splits + 1) > slots, "a wave left emptier than it need be"


def test_split_rule_on_an_h100():
    # the counts the H100 run took (BENCHMARKS.md, "MLA decode"): 16 heads at 2 programs an SM (the
    # binary's occupancy), 128 heads (two 64-head programs) at 1; the double-buffered 16-head tile
    # stops at 128 splits, the single-buffered ones (fp8) at 256
    h16 = S.max_splits(S.split_axes("bf16", "bf16", 576, 512, "latent", "h16"), 90)
    fp8 = S.max_splits(S.split_axes("bf16", "fp8_e4m3", 576, 512, "latent", "h16"), 90)
    h64 = S.max_splits(S.split_axes("bf16", "bf16", 576, 512, "latent", "h64"), 90)
    assert [S.num_splits(b, 1, 16, "h16", 132, 2, h16) for b in (1, 32, 128)] == [128, 8, 2]
    assert [S.num_splits(b, 1, 16, "h16", 132, 2, fp8) for b in (1, 32, 128)] == [256, 8, 2]
    assert [S.num_splits(b, 1, 128, "h64", 132, 1, h64) for b in (1, 32, 128)] == [66, 2, 1]


def test_double_buffered_tiles():
    # page ids one tile ahead and 3 stages: the 16- and 32-head latent tiles over 16-bit caches on
    # sm90 only (sm80's shared memory holds one such h16 program and no h32 one)
    def page_ahead(q, kv, layout, tile, arch, d_qk=576, d_v=512):
        axes = S.split_axes(q, kv, d_qk, d_v, layout, tile)
        on = S.page_ahead(axes, arch)
        cfg = S.SPLIT.launch_config(axes, arch)
        assert S.SPLIT.compile_constexprs(axes, arch)["PAGE_AHEAD"] == int(on)
        assert cfg.num_stages == (3 if on else 2)
        assert S.max_splits(axes, arch) == (S.PAGE_AHEAD_MAX_SPLITS if on else S.RULE_MAX_SPLITS)
        return on

    assert page_ahead("bf16", "bf16", "latent", "h16", 90) and page_ahead("fp16", "fp16", "latent", "h32", 90)
    assert not page_ahead("bf16", "bf16", "latent", "h16", 80)
    assert not page_ahead("bf16", "bf16", "latent", "h32", 80)
    assert not page_ahead("bf16", "bf16", "latent", "h64", 90)
    assert not page_ahead("bf16", "fp8_e4m3", "latent", "h16", 90)
    assert not page_ahead("bf16", "bf16", "separate", "h16", 90)
    assert not page_ahead("bf16", "bf16", "separate", "h16", 90, 192, 128)
