"""The chunked gated delta rule's variant table: counts, keys, the kernels' parameter lists, launch configs."""
import inspect
import re

from aotc.kernels.gated_delta import chunk, chunk_spec
from aotc.kernels.registry import all_specs
from aotc.kernels.variants import VariantKey


def test_registered_with_counts():
    specs = all_specs()
    assert specs["gdn_chunk_prep"] is chunk_spec.GDN_CHUNK_PREP
    assert specs["gdn_chunk_state"] is chunk_spec.GDN_CHUNK_STATE
    assert len(list(chunk_spec.prep_variants())) == 12  # dtype x head dim (K == V) x gate
    assert len(list(chunk_spec.state_variants())) == 6  # dtype x head dim: one binary serves GDN, KDA, both layouts
    assert len(chunk_spec.GDN_CHUNK_PREP.keys()) + len(chunk_spec.GDN_CHUNK_STATE.keys()) == 36  # x 2 levels


def test_keys_round_trip():
    for spec in chunk_spec.KERNELS:
        for key in spec.keys():
            assert VariantKey.parse(str(key)) == key


def test_parameters_match_the_kernels():
    for spec in chunk_spec.KERNELS:
        fn = getattr(chunk, spec.function)
        names = list(inspect.signature(fn.fn).parameters)
        assert names == [a.name for a in spec.args] + list(spec.constexpr_names)
        # the decorator's list, read from the source (the interpreter's wrapper does not keep it)
        source = inspect.getsource(chunk)
        at = source.index(f"def {spec.function}(")
        decorator = source[source.rindex("@triton.jit(", 0, at):at]
        unspecialized = set(re.findall(r'"(\w+)"', decorator.split("do_not_specialize_on_alignment")[0]))
        # every runtime int not assumed divisible by 16 is unspecialized: one binary serves all values
        for a in spec.args:
            if a.kind == "i32" and not a.aligned:
                assert a.name in unspecialized, a.name


def test_launch_configs():
    for axes in chunk_spec.state_variants():
        for arch in (80, 90):
            cfg = chunk_spec.state_launch(axes, arch)
            assert (cfg.num_warps, cfg.num_stages) == ((16, 1) if axes["head_k"] == 256 else (4, 2))
            assert axes["head_v"] % chunk_spec.block_v(axes["head_v"]) == 0
    assert chunk_spec.prep_launch({"head_k": 128, "head_v": 128}, 90).num_warps == 4
    assert chunk_spec.prep_constexprs(chunk_spec.prep_axes("bf16", 128, 128, True)) == {
        "HEAD_K": 128, "HEAD_V": 128, "KDA": 1}
