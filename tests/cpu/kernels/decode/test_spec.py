"""The decode variant table: decorators agree with the Arg lists, launch geometry is length-free."""
import pytest

from aotc.aot.triton_compat import check_consistency
from aotc.kernels.decode import kernel, spec as S
from aotc.kernels.variants import VariantKey
from tests.cpu.kernels.decorators import as_jit


@pytest.mark.parametrize("spec", S.KERNELS, ids=lambda s: s.name)
def test_decorator_matches_spec(spec):
    fn = as_jit(getattr(kernel, spec.function))
    check_consistency(spec, fn)  # the build's own check: names, order, specialization switches
    # and the constexprs after every runtime argument, in the spec's order
    assert [p.name for p in fn.params] == [a.name for a in spec.args] + list(spec.constexpr_names)
    assert all(p.is_constexpr for p in fn.params[len(spec.args):])


def test_variant_count_and_keys():
    split = list(S.SPLIT.variants())
    merge = list(S.MERGE.variants())
    # q dtype 2 x (own float + int8 x 3 scales + int4 x 3 + fp8 x 2) x head_dim 4: the int8/int4
    # ones read groups of 8-16 channels (and 32 at head dims 64, 96) ("small_group"); they add
    # groups of 32+ ("group") at head dims 128 and 256, and one scale a token ("token", group ==
    # head_dim) at 64 and 128; int8 groups of 64 at head_dim 128 ("chunk", q dtype x 3 scale
    # dtypes); int4 one scale a token at head_dim 128 comes in both tiles (q dtype x 3 scale dtypes);
    # int8 with fp32 scales per KV head and channel ("channel") at every head dim (q dtype x 4)
    # plus vLLM's (spec.vllm_variants): q dtype x (3 formats x 4 head dims with "mod" + int8 / fp8
    # e4m3 per token x 2 head dims x plain/mod at kv_align 4 and 8 + int4_zp and int4_rht, vLLM's
    # INT4_PER_TOKEN_HEAD read as stored and rotated back: head dim 64's narrow tile and 128's narrow and wide)
    assert len(split) == 2 * (1 + 3 + 3 + 2) * 4 + 2 * 2 * 3 * 2 + 2 * 2 * 3 * 2 + 2 * 3 + 2 * 3 + 2 * 4 \
        + 2 * (3 * 4 + 2 * 2 * 2 * 2 + 2 * 3) == 208
    assert sum(a["scales"] == "channel" for a in split) == 8
    assert len(merge) == 2 * 4 * 5  # out dtype x head_dim x split tile (4, 16, 64, 256, the loop)
    keys = S.SPLIT.keys() + S.MERGE.keys()
    assert len(set(keys)) == len(keys) == 2 * (208 + 40)
    for k in keys:
        assert VariantKey.parse(str(k)) == k


@pytest.mark.parametrize("kv", ["int4_zp", "int4_rht"])
def test_int4_zp_variants(kv):
    zp = [a for a in S.SPLIT.variants() if a["kv"] == kv]
    assert sorted((a["q"], a["head_dim"], a["tile"]) for a in zp) == sorted(
        (q, hd, t) for q in ("fp16", "bf16") for hd, t in ((64, "narrow"), (128, "narrow"), (128, "wide")))
    assert all(a["scales"] == "token" and a["scale"] == "fp32" and a["cache"] == "int4" and "kv_align" not in a
               for a in zp)
    assert S.split_constexprs(zp[0])["KV_KIND"] == 5
    assert all(S.split_constexprs(a)["RHT"] == (kv == "int4_rht") for a in zp)
    with pytest.raises(ValueError, match="one scale a token"):
        S.split_axes("bf16", kv, "fp32", 128)
    with pytest.raises(ValueError, match="head_dim"):
        S.split_axes("bf16", kv, "fp32", 96, per_token=True)
    with pytest.raises(ValueError, match="fp32"):
        S.split_axes("bf16", kv, "fp16", 128, per_token=True)
    with pytest.raises(ValueError, match="mod"):
        S.split_axes("bf16", kv, "fp32", 128, per_token=True, score="mod")
    with pytest.raises(ValueError, match="kv_align"):
        S.split_axes("bf16", kv, "fp32", 128, per_token=True, kv_align=4)


def test_merge_tile_is_the_smallest_that_holds_the_splits():
    assert [S.merge_split_tile(s) for s in (1, 4, 5, 16, 17, 64, 65, 256, 257, 512)] == \
        [4, 4, 16, 16, 64, 64, 256, 256, 512, 512]
    assert S.merge_axes("bf16", 128, 3)["splits"] == 4
    assert S.merge_constexprs(S.merge_axes("fp16", 96, 40))["BLOCK_S"] == 64
    assert S.merge_grid(2, 8, S.merge_axes("fp16", 96, 16)) == (2, 8, 1)  # up to 16 splits: whole heads
    assert S.merge_grid(2, 8, S.merge_axes("fp16", 96, 40)) == (2, 8, 3)  # 64-split tile: 32 channels a program
    assert S.merge_launch(S.merge_axes("bf16", 128, 40), 90).num_warps == 1


def test_wide_merge_is_one_tile_over_channel_blocks():
    c = S.merge_constexprs(S.merge_axes("bf16", 128, 65))
    assert (c["LOOP"], c["BLOCK_S"], c["BLOCK_D"]) == (0, S.MERGE_WIDE_SPLITS, S.MERGE_NARROW_D)
    assert S.merge_grid(1, 16, S.merge_axes("bf16", 256, 256)) == (1, 16, 256 // S.MERGE_NARROW_D)
    assert S.merge_grid(1, 32, S.merge_axes("fp16", 96, 100)) == (1, 32, 3)
    launch = S.merge_launch(S.merge_axes("bf16", 128, 200), 90)
    assert (launch.num_warps, launch.num_stages) == (4, 1)


def test_looping_merge_spreads_channels_over_programs():
    c = S.merge_constexprs(S.merge_axes("bf16", 256, 257))
    assert (c["LOOP"], c["BLOCK_S"], c["BLOCK_D"]) == (1, S.MERGE_LOOP_SPLITS, S.MERGE_LOOP_D)
    assert S.merge_grid(1, 32, S.merge_axes("bf16", 256, 300)) == (1, 32, 256 // S.MERGE_LOOP_D)
    assert S.merge_grid(1, 32, S.merge_axes("bf16", 96, 300)) == (1, 32, 2)  # 96 channels: a masked second block
    assert S.merge_launch(S.merge_axes("bf16", 128, 257), 90).num_stages == 2
    for bad in (0, S.MAX_SPLITS + 1):
        with pytest.raises(ValueError, match="splits"):
            S.merge_split_tile(bad)


def test_split_and_merge_are_dependent_launches_on_sm90_only():
    axes = S.merge_axes("bf16", 128, 3)
    assert S.merge_launch(axes, 90).launch_pdl and S.merge_launch(axes, 90).triton_options()["launch_pdl"]
    assert not S.merge_launch(axes, 80).launch_pdl and "launch_pdl" not in S.merge_launch(axes, 80).triton_options()
    assert S.MERGE.compile_constexprs(axes, 90)["PDL"] == 1 and S.MERGE.compile_constexprs(axes, 80)["PDL"] == 0
    split = S.split_axes("bf16", "int8", "bf16", 128, quant_group=64)
    for tile in ("wide", "narrow"):
        axes = dict(split, tile=tile)
        assert S.split_launch(axes, 90).launch_pdl and S.SPLIT.compile_constexprs(axes, 90)["PDL"] == 1
        assert not S.split_launch(axes, 80).launch_pdl and S.SPLIT.compile_constexprs(axes, 80)["PDL"] == 0


@pytest.mark.parametrize("head_dim,quant_group,want", [
    (64, 8, "small_group"), (64, 32, "small_group"), (96, 8, "small_group"), (96, 32, "small_group"),
    (128, 16, "small_group"), (128, 32, "group"), (128, 64, "group"), (256, 128, "group"), (256, 32, "group"),
    (256, 16, "small_group")])
def test_quant_group_picks_how_scales_are_read(head_dim, quant_group, want):
    axes = S.split_axes("bf16", "int4", "bf16", head_dim, quant_group=quant_group)
    assert axes["scales"] == want
    assert S.split_constexprs(axes)["ROW_SCALES"] == int(want == "small_group")
    assert S.split_constexprs(axes)["CHUNK_SCALES"] == 0
    assert axes in list(S.SPLIT.variants())
    assert S.split_axes("bf16", "int8", "fp32", 128, per_token=True)["scales"] == "token"
    with pytest.raises(ValueError, match="head dims"):
        S.split_axes("bf16", "int8", "fp32", 96, quant_group=64)


def test_signature_reads_fp8_and_int4_as_bytes():
    sig = S.SPLIT.signature(S.split_axes("bf16", "fp8_e4m3", "fp32", 128))
    assert sig["K"] == sig["V"] == "*i8" and sig["KS"] == "*fp32" and sig["Q"] == "*bf16"
    sig = S.SPLIT.signature(S.split_axes("fp16", "int4", "bf16", 64, quant_group=8))
    assert sig["K"] == "*i8" and sig["KS"] == "*bf16"
    c = S.split_constexprs(S.split_axes("fp16", "fp16", "fp32", 96))
    assert c["BLOCK_D"] == 128 and c["HEAD_DIM"] == 96 and c["BLOCK_N"] == S.block_n(96)
    assert S.block_n(256) == S.block_n(128) // 2


@pytest.mark.parametrize("args,match", [
    (("fp32", "fp16", "fp32", 64), "query dtype"),
    (("bf16", "fp16", "fp32", 64), "needs an fp16 query"),
    (("bf16", "int8", "fp8", 64), "int8 scales"),
    (("bf16", "fp8_e4m3", "fp16", 64), "fp32 scales"),
    (("bf16", "int4", "fp16", 80), "head_dim"),
])
def test_split_axes_rejects(args, match):
    with pytest.raises(ValueError, match=match):
        S.split_axes(*args)


@pytest.mark.parametrize("batch", [1, 2, 7, 32, 256, 4096])
@pytest.mark.parametrize("kv_heads,group", [(8, 4), (1, 32), (32, 1), (2, 16)])
def test_num_splits_fills_the_gpu_and_stays_bounded(batch, kv_heads, group):
    sms = 132
    splits = S.num_splits(batch, kv_heads, group, sms)
    assert 1 <= splits <= S.RULE_MAX_SPLITS
    programs = S.split_grid(batch, kv_heads, group, splits)
    total = programs[0] * programs[1] * programs[2]
    assert total >= sms or splits == S.RULE_MAX_SPLITS
    # Workspace per call: batch * q_heads * splits partial rows, bounded independently of batch
    # once the grid is full.
    rows = batch * kv_heads * group * splits
    assert rows <= max(batch * kv_heads * group, S.PROGRAMS_PER_SM * sms * S.BLOCK_H * 2)


def test_batch_one_long_context_spreads_over_an_h100():
    splits = S.num_splits(1, 8, 4, 132)
    assert splits == S.RULE_MAX_SPLITS and 8 * splits >= 132


def test_register_cap_is_for_wide_per_group_int_variants_up_to_head_dim_128_groups_of_32_up_at_256_and_fp8_kv_align_8():
    for axes in S.split_variants():
        cfg = S.split_launch(axes, 90)
        grouped = axes["scales"] in ("group", "small_group") and axes["head_dim"] <= 128
        group_256 = (axes["scales"], axes["head_dim"]) == ("group", 256)
        want = 168 if (grouped and axes["tile"] == "wide") or group_256 or (axes.get("kv_align"), axes["kv"]) == (8, "fp8_e4m3") else 0
        if axes["kv"] == "int4_rht":  # int4_zp's register counts: narrow 184 at head_dim 128, else 168
            want = 184 if (axes["tile"], axes["head_dim"]) == ("narrow", 128) else 168
        assert cfg.maxnreg == want, axes
        if axes["head_dim"] == 256 and axes["scales"] != "none":  # int4 "group": 3 stages there
            assert cfg.num_stages == (3 if (axes["kv"], axes["scales"]) == ("int4", "group") else 2), axes


def test_tiles_declared_per_format_and_head_dim():
    variants = list(S.split_variants())
    narrow = {(a["kv"], a["head_dim"], a["scales"]) for a in variants if a["tile"] == "narrow"}
    wide = {(a["kv"], a["head_dim"], a["scales"]) for a in variants if a["tile"] == "wide"}
    assert narrow == {("int4", 64, "token"), ("int4", 64, "small_group"), ("int4", 128, "token"),
                      ("int4_zp", 64, "token"), ("int4_zp", 128, "token"), ("int4_rht", 64, "token"),
                      ("int4_rht", 128, "token")}
    assert ("int4", 128, "token") in wide and not any(kv == "int4" and hd == 64 for kv, hd, _ in wide)
    for a in variants:
        cfg, c = S.split_launch(a, 90), S.split_constexprs(a)
        if a["tile"] == "narrow":
            assert (cfg.num_warps, cfg.num_stages, c["BLOCK_N"]) == (2, 3, 64), a
        else:
            assert cfg.num_warps == 4 and c["BLOCK_N"] == S.block_n(a["head_dim"]), a
    assert S.split_axes("bf16", "int4", "bf16", 64, per_token=True)["tile"] == "narrow"
    assert S.split_axes("bf16", "int4", "bf16", 128, per_token=True, tile="wide")["tile"] == "wide"
    with pytest.raises(ValueError, match="tile 'narrow'"):
        S.split_axes("bf16", "int8", "bf16", 128, per_token=True, tile="narrow")
    with pytest.raises(ValueError, match="tile 'wide'"):
        S.split_axes("bf16", "int4", "bf16", 64, quant_group=8, tile="wide")


@pytest.mark.parametrize("base,want", [(1, "wide"), (8, "wide"), (12, "wide"), (13, "narrow"), (256, "narrow")])
def test_narrow_tile_when_the_grid_fills_an_h100_with_it(base, want):
    # 132 SMs x 6 narrow programs = 792 slots; base programs x 64 splits must reach them
    assert S.choose_tile(("narrow", "wide"), base, 132) == want
    assert S.choose_tile(("wide",), 4096, 132) == "wide" and S.choose_tile(("narrow",), 1, 132) == "narrow"


@pytest.mark.parametrize("per_sm", [2, 3, 4, 5])
@pytest.mark.parametrize("batch", [1, 2, 3, 7, 16, 32, 64, 128, 1024])
@pytest.mark.parametrize("kv_heads,group", [(8, 4), (1, 32), (32, 1)])
def test_split_count_with_occupancy_fills_whole_waves_or_keeps_the_base(batch, kv_heads, group, per_sm):
    sms = 132
    base = S.num_splits(batch, kv_heads, group, sms)
    splits = S.num_splits(batch, kv_heads, group, sms, per_sm)
    assert 1 <= splits <= S.RULE_MAX_SPLITS
    programs, slots = batch * kv_heads * S.head_blocks(group), per_sm * sms
    n = programs * splits
    if splits != base:
        assert n >= 0.95 * slots * -(-n // slots), "moved to a count whose last wave is not full"
        assert programs * base < 4 * slots
        # nothing nearer to the base count qualifies
        for s in range(1, S.RULE_MAX_SPLITS + 1):
            if abs(s - base) < abs(splits - base):
                m = programs * s
                assert m < 0.95 * slots * -(-m // slots)


def test_split_count_on_an_h100_at_three_programs_an_sm():
    # The counts the H100 sweep timed (git show 56b4b83:bench/results/2026-11-22-h100-session5-notes.txt).
    assert [S.num_splits(b, 8, 4, 132, 3) for b in (1, 32, 64)] == [49, 3, 3]
    assert [S.num_splits(b, 8, 4, 132, 2) for b in (1, 32, 64)] == [64, 3, 2]
    assert S.num_splits(1, 8, 4, 132, None) == 64


@pytest.mark.parametrize("head_dim,quant_group,want", [
    (128, 64, "chunk"), (128, 32, "group"), (128, 16, "small_group"), (256, 128, "group"), (256, 64, "group"),
    (64, 32, "small_group")])
def test_int8_groups_of_64_at_head_dim_128_scale_chunk_dots(head_dim, quant_group, want):
    axes = S.split_axes("bf16", "int8", "fp16", head_dim, quant_group=quant_group)
    assert axes["scales"] == want
    ce = S.split_constexprs(axes)
    assert (ce["CHUNK_SCALES"], ce["PER_TOKEN"], ce["ROW_SCALES"]) == (int(want == "chunk"), 0, int(want == "small_group"))
    assert axes in list(S.SPLIT.variants())
    cfg = S.split_launch(axes, 90)
    # chunk: 3 stages uncapped; per-element scales: 3 stages at 168 registers up to head_dim 128, 2 at 256
    assert (cfg.num_stages, cfg.maxnreg) == ((3, 0) if want == "chunk" else (3, 168) if head_dim <= 128 else (2, 168))


def test_vllm_variants():
    # score "mod" and kv_align 4 appear only in vLLM's keys; the others' keys keep their axes
    mod = S.split_axes("bf16", "fp8_e5m2", "fp32", 96, score="mod")
    assert (mod["score"], mod["kv_align"]) == ("mod", 16) and mod in list(S.SPLIT.variants())
    assert "score" not in S.split_axes("bf16", "int8", "fp32", 128, per_token=True)
    fp8 = S.split_axes("fp16", "fp8_e4m3", "fp32", 128, per_token=True, kv_align=4)
    assert fp8["scales"] == "token" and S.split_constexprs(fp8)["KV_ALIGN"] == 4
    assert S.split_constexprs(fp8)["PER_TOKEN"] == 1 and fp8 in list(S.SPLIT.variants())
    for bad in (dict(kv="int8", per_token=False, quant_group=64, score="mod"),  # per-group int8: no mod
                dict(kv="fp8_e4m3", per_token=True),  # fp8 per token is kv_align 4 only
                dict(kv="fp8_e5m2", per_token=True, kv_align=4),
                dict(kv="bf16", kv_align=4)):
        kv = bad.pop("kv")
        with pytest.raises(ValueError):
            S.split_axes("bf16", kv, "fp32", 128, **bad)
