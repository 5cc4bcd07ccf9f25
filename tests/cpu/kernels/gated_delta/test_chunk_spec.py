"""The chunked gated delta rule's variant table: counts, keys, the kernels' parameter lists, launch configs."""
import importlib
import inspect
import re

import pytest

from aotc.kernels.gated_delta import chunk, chunk_spec
from aotc.kernels.registry import all_specs
from aotc.kernels.variants import VariantKey


def test_registered_with_counts():
    specs = all_specs()
    assert specs["gdn_chunk_prep"] is chunk_spec.GDN_CHUNK_PREP
    assert specs["gdn_chunk_state"] is chunk_spec.GDN_CHUNK_STATE
    assert specs["gdn_chunk_state_generic"] is chunk_spec.GDN_CHUNK_STATE_GENERIC
    assert specs["kda_chunk_intra"] is chunk_spec.KDA_CHUNK_INTRA
    assert specs["kda_chunk_inter"] is chunk_spec.KDA_CHUNK_INTER
    assert specs["kda_chunk_wy"] is chunk_spec.KDA_CHUNK_WY
    # dtype x head tile (K == V), GDN only; KDA's three kernels dtype x head tile each
    assert len(list(chunk_spec.prep_variants())) == 9
    assert [len(list(s.variants())) for s in (chunk_spec.KDA_CHUNK_INTRA, chunk_spec.KDA_CHUNK_INTER,
                                               chunk_spec.KDA_CHUNK_WY)] == [9, 9, 9]
    # 16-bit dtypes x (head tile, bv): bv 32 and 64 at 64, 32 and 128 at 128, 32 at 256; fp32 bv 32 at
    # every tile; one binary serves GDN, KDA and both layouts
    assert len(list(chunk_spec.state_variants())) == 13
    # x 2 levels: the state pass's aligned and generic binaries are two specs of one kernel
    assert len(chunk_spec.GDN_CHUNK_PREP.keys()) == 18
    assert len(chunk_spec.KDA_CHUNK_INTRA.keys()) == len(chunk_spec.KDA_CHUNK_WY.keys()) == 18
    assert len(chunk_spec.GDN_CHUNK_STATE.keys()) == len(chunk_spec.GDN_CHUNK_STATE_GENERIC.keys()) == 13
    assert {k.level for k in chunk_spec.GDN_CHUNK_STATE.keys()} == {"aligned"}
    assert {k.level for k in chunk_spec.GDN_CHUNK_STATE_GENERIC.keys()} == {"generic"}


def test_16_bit_generic_state_binaries_take_16_warps():
    for axes in chunk_spec.state_variants():
        cfg = chunk_spec.GDN_CHUNK_STATE_GENERIC.launch_config(axes, 90)
        if axes["dtype"] != "fp32":  # the 64 tile's 4 warps computed K = 60 wrong on the H100
            assert (cfg.num_warps, cfg.num_stages) == (16, 1)
        else:
            assert cfg == chunk_spec.GDN_CHUNK_STATE.launch_config(axes, 90)


def test_head_tile_rounds_up():
    assert [chunk_spec.head_tile(d) for d in (1, 32, 60, 64, 65, 100, 128, 129, 256)] == [
        64, 64, 64, 64, 128, 128, 128, 256, 256]


def test_keys_round_trip():
    for spec in chunk_spec.KERNELS:
        for key in spec.keys():
            assert VariantKey.parse(str(key)) == key


def test_parameters_match_the_kernels():
    for spec in chunk_spec.KERNELS:
        module = importlib.import_module(spec.module)  # chunk.py, kda_chunk.py
        fn = getattr(module, spec.function)
        names = list(inspect.signature(fn.fn).parameters)
        assert names == [a.name for a in spec.args] + list(spec.constexpr_names)
        # the decorator's list, read from the source (the interpreter's wrapper does not keep it)
        source = inspect.getsource(module)
        at = source.index(f"def {spec.function}(")
        decorator = source[source.rindex("@triton.jit(", 0, at):at]
        unspecialized = set(re.findall(r'"(\w+)"', decorator.split("do_not_specialize_on_alignment")[0]))
        # every runtime int not assumed divisible by 16 is unspecialized: one binary serves all values
        for a in spec.args:
            if a.kind == "i32" and not a.aligned:
                assert a.name in unspecialized, a.name


def test_launch_configs():
    seen = set()
    for axes in chunk_spec.state_variants():
        d, bv = axes["head_k"], axes["bv"]
        seen.add((d, bv))
        assert chunk_spec.state_constexprs(axes) == {"HEAD_K": d, "HEAD_V": d, "BV": bv}
        assert axes["head_v"] % bv == 0
        for arch in (80, 90):
            cfg = chunk_spec.state_launch(axes, arch)
            if d == 256:  # the configs Triton 3.6 compiled right there (state_launch)
                expected = (4, 1) if axes["dtype"] == "fp32" else (16, 1)
            elif axes["dtype"] == "fp32":
                expected = (4, 2)
            else:
                expected = (4, 3) if bv == 32 else (8, 2)  # BV 32: 3 stages on CUDA
            assert (cfg.num_warps, cfg.num_stages, cfg.maxnreg) == (*expected, 0)
            # BV 32 at one stage hit an illegal memory access at K = V = 128 on the H100
            assert d == 256 or not (bv == 32 and cfg.num_stages == 1)
    assert seen == {(64, 32), (64, 64), (128, 32), (128, 128), (256, 32)}
    assert chunk_spec.prep_launch({"head_k": 128, "head_v": 128, "gate": "gdn"}, 90).num_warps == 4
    with pytest.raises(ValueError, match="only 'gdn'"):  # KDA runs its own three kernels
        chunk_spec.prep_constexprs(chunk_spec.prep_axes("bf16", 128, 128, True))
    assert chunk_spec.KDA_CHUNK_INTER.compile_constexprs(chunk_spec.kda_a_axes("bf16", 128), 90) == {
        "HEAD_K": 128, "TF32": 1}
    assert chunk_spec.KDA_CHUNK_WY.compile_constexprs(chunk_spec.kda_wy_axes("bf16", 128, 128), 90) == {
        "HEAD_K": 128, "HEAD_V": 128, "MERGE_TF32": 1}
    # GDN takes the sub-block path only at fp32 with the 256 tile (shared memory)
    assert [chunk_spec.prep_constexprs(chunk_spec.prep_axes(dt, d, d, False))["SUBBLOCKS"]
            for dt, d in (("bf16", 256), ("fp32", 128), ("fp32", 256))] == [0, 0, 1]


def test_state_tiles_fit_amd_lds():
    # 64 KiB of LDS a workgroup: Triton 3.6's BV128 binary takes 88 KiB at 2 stages there, 64 at one;
    # BV 32's 64 at 2 (CUDA takes 3).
    from aotc.loader import targets

    for name in ("gfx942", "gfx90a"):
        arch = targets.get(name).spec_arch()
        for d in (64, 128):
            wide = chunk_spec.GDN_CHUNK_STATE.launch_config(chunk_spec.state_axes("bf16", d, d, d), arch)
            assert (wide.num_warps, wide.num_stages) == (8, 1)
            narrow = chunk_spec.GDN_CHUNK_STATE.launch_config(chunk_spec.state_axes("bf16", d, d, 32), arch)
            assert (narrow.num_warps, narrow.num_stages) == (4, 2)  # 3 stages would not fit 64 KiB
            narrow = chunk_spec.GDN_CHUNK_STATE.launch_config(chunk_spec.state_axes("bf16", d, d, 32), arch)
            assert (narrow.num_warps, narrow.num_stages) == (4, 2)


def test_state_launch_refuses_an_undeclared_tile():
    with pytest.raises(ValueError, match="bv 64 is not one of"):
        chunk_spec.state_launch(chunk_spec.state_axes("bf16", 128, 128, 64), 90)
    with pytest.raises(ValueError, match="bv 256 is not one of"):
        chunk_spec.state_launch(chunk_spec.state_axes("bf16", 256, 256, 256), 90)


def test_prep_caps_registers_for_gdn_up_to_128():
    for axes in chunk_spec.prep_variants():
        cfg = chunk_spec.prep_launch(axes, 90)
        small = axes["head_k"] <= 128
        assert cfg.maxnreg == (168 if small and axes["dtype"] != "fp32" else 0)
        assert (cfg.num_warps, cfg.num_stages) == ((4, 1) if small else (8, 1))
    # the cap is a CUDA compile option: dropped on AMD
    from aotc.loader import targets

    gfx = targets.get("gfx942").spec_arch()
    assert chunk_spec.GDN_CHUNK_PREP.launch_config(chunk_spec.prep_axes("bf16", 128, 128, False), gfx).maxnreg == 0


def test_block_vs_per_head_pair():
    assert chunk_spec.state_block_vs(64, 64) == (32, 64)
    assert chunk_spec.state_block_vs(128, 128) == (32, 128)
    assert chunk_spec.state_block_vs(128, 64) == (32, 64)  # a pair the JIT fallback serves
    assert chunk_spec.state_block_vs(256, 256) == (32,)
    assert chunk_spec.state_block_vs(256, 128) == (32,) and chunk_spec.state_block_vs(128, 256) == (32,)
    assert chunk_spec.state_block_vs(64, 32) == (32,)
    assert chunk_spec.state_block_vs(128, 128, "fp32") == (32,) and chunk_spec.state_block_v(8, 32, 128, 128, 132,
                                                                                             "fp32") == 32


def test_state_block_v_choice():
    pick = chunk_spec.state_block_v
    # the H100 measurements (132 SMs, HV = 32, K = V = 128): 1 x 8192 best at 32, 8 x 2048 at 128
    assert pick(1, 32, 128, 128, 132) == 32
    assert pick(8, 32, 128, 128, 132) == 128
    # the boundary: the wide tile once it gives a program an SM
    assert pick(1, 131, 128, 128, 132) == 32
    assert pick(1, 132, 128, 128, 132) == 128
    assert pick(3, 44, 128, 128, 132) == 128  # 132 sequence-heads
    assert pick(5, 26, 128, 128, 132) == 32  # 130
    assert pick(8, 32, 128, 128, 108) == 128 and pick(3, 32, 128, 128, 108) == 32  # an A100's 108 SMs
    # head dim 64: the wide tile is 64, one program a sequence-head, so the same threshold
    assert pick(1, 32, 64, 64, 132) == 32
    assert pick(8, 32, 64, 64, 132) == 64
    assert pick(8, 32, 128, 64, 132) == 64
    # head dim 256: only 32 is built, whatever the batch
    assert pick(1, 32, 256, 256, 132) == 32
    assert pick(64, 32, 256, 256, 132) == 32
    assert pick(64, 32, 128, 256, 132) == 32
    # no sequences (the op returns before launching; the choice is still defined)
    assert pick(0, 32, 128, 128, 132) == 32


def test_block_merges_take_tf32_on_cuda_targets_only():
    # Triton 3.6 refuses tf32 dots on gfx90a (and allows them on no other AMD target but gfx942);
    # the merges stay exact fp32 off CUDA (chunk._mm).
    from aotc.loader import targets

    axes = chunk_spec.prep_axes("bf16", 128, 128, False)
    for name in ("sm80", "sm90"):
        arch = targets.get(name).spec_arch()
        assert chunk_spec.GDN_CHUNK_PREP.compile_constexprs(axes, arch)["MERGE_TF32"] == 1
    for name in ("gfx942", "gfx90a", "ivcore20"):
        arch = targets.get(name).spec_arch()
        assert chunk_spec.GDN_CHUNK_PREP.compile_constexprs(axes, arch)["MERGE_TF32"] == 0
    assert chunk_spec.GDN_CHUNK_PREP.compile_constexprs(axes, 90) == dict(
        chunk_spec.prep_constexprs(axes), MERGE_TF32=1)
