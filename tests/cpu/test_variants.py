"""Variant keys round-trip and reject what they cannot hold; specs declare each of their levels per variant."""
import pytest

from aotc.kernels.registry import all_specs, get_spec
from aotc.kernels.variants import ALIGNED, GENERIC, Arg, KernelSpec, VariantKey


def test_keys_round_trip_and_sort_their_axes():
    k = VariantKey.make("decode", {"kv": "int4", "head_dim": 128, "q": "bf16"}, GENERIC)
    assert str(k) == "decode(head_dim=128,kv=int4,q=bf16)@generic"
    assert VariantKey.parse(str(k)) == k and VariantKey.parse(str(k)).axis_dict["head_dim"] == 128
    assert VariantKey.parse("k()@aligned") == VariantKey.make("k", {}, ALIGNED)


@pytest.mark.parametrize("text", ["decode(head_dim=128", "decode(x)@aligned", "decode()@fast", "1x()@aligned"])
def test_malformed_keys_are_refused(text):
    with pytest.raises(ValueError):
        VariantKey.parse(text)


def test_values_a_key_cannot_hold_are_refused():
    with pytest.raises(ValueError):
        VariantKey.make("k", {"a": "x,y"})
    with pytest.raises(TypeError):
        VariantKey.make("k", {"a": True})
    with pytest.raises(ValueError):
        Arg("p", "ptr")  # a pointer needs its dtype


def test_every_declared_variant_comes_at_each_of_its_levels():
    for spec in all_specs().values():
        keys = spec.keys()
        assert len(keys) == len(spec.levels) * len({k.axes for k in keys}), spec.name
        assert {k.level for k in keys} == set(spec.levels), spec.name
        assert spec.divisible_args(GENERIC) == ()
    # Only the Gluon kernels (prefix prefill's two, the gated delta state pass) cannot compile without
    # ALIGNED's assumptions (prefix_prefill_ws_rec's are q's and out's only); the Triton gated delta
    # state pass declares its two levels as two specs (their launch configs differ).
    assert {s.name: s.levels for s in all_specs().values() if s.levels != (ALIGNED, GENERIC)} == {
        "prefix_prefill_ws": (ALIGNED,), "prefix_prefill_ws_rec": (ALIGNED,), "gdn_chunk_state": (ALIGNED,),
        "gdn_chunk_state_generic": (GENERIC,), "gdn_chunk_state_ws": (ALIGNED,)}


def test_levels_and_kind_are_checked():
    tiny = get_spec("tiny_axpy")
    fields = {f: getattr(tiny, f) for f in ("name", "module", "function", "args", "constexpr_names", "constexprs",
                                              "variants", "launch")}
    assert KernelSpec(**fields, levels=(ALIGNED,)).keys() == [k for k in tiny.keys() if k.level == ALIGNED]
    for bad in ((), ("aligned", "loose")):
        with pytest.raises(ValueError, match="levels"):
            KernelSpec(**fields, levels=bad)
    with pytest.raises(ValueError, match="kind"):
        KernelSpec(**fields, kind="cuda")


def test_tiny_signature():
    spec = get_spec("tiny_axpy")
    assert spec.signature({"dtype": "fp16", "block": 64}) == {
        "x": "*fp16", "y": "*fp16", "out": "*fp16", "stride_x": "i32", "n": "i32", "rows": "i32", "alpha": "fp32",
        "BLOCK": "constexpr", "SCALE_Y": "constexpr"}


def test_launch_config_passes_a_register_cap_only_when_set():
    from aotc.kernels.variants import LaunchConfig

    assert LaunchConfig(4, 2).triton_options() == {"num_warps": 4, "num_stages": 2, "num_ctas": 1}
    assert LaunchConfig(4, 3, maxnreg=168).triton_options() == {"num_warps": 4, "num_stages": 3, "num_ctas": 1,
                                                                 "maxnreg": 168}
    assert LaunchConfig(4, 2) != LaunchConfig(4, 2, maxnreg=168)  # part of the build hash
    with pytest.raises(ValueError, match="maxnreg"):
        LaunchConfig(4, 2, maxnreg=300)


def test_gluon_kernels_build_for_sm90_only():
    from aotc.kernels.variants import LaunchConfig, TargetArch, as_target_arch

    gluon = [s for s in all_specs().values() if s.kind == "gluon"]
    assert {s.name for s in gluon} >= {"prefix_prefill_ws", "gdn_chunk_state_ws"}
    for spec in gluon:
        axes = next(iter(spec.variants()))
        assert spec.launch(axes, as_target_arch(90)) == LaunchConfig(num_warps=4, num_stages=1)
        for arch in (as_target_arch(80), as_target_arch(100), TargetArch(0, "gfx942", "hip", 64),
                     TargetArch(0, "ivcore20", "corex", 64)):
            assert spec.launch(axes, arch) is None, (spec.name, arch)
