"""Dispatch on manifest data, no GPU: which binary an aligned, a misaligned and a unit-stride
call get, why the others were rejected, and what is launched (through a fake driver)."""
import struct

import pytest

from aotc.kernels.registry import get_spec
from aotc.kernels.variants import ALIGNED, GENERIC
from aotc.loader import artifacts, dispatch
from aotc.loader.manifest import ManifestError

from .conftest import FakeTensor

AXES = {"block": 64, "dtype": "fp16"}


def values(x=0x1000, y=0x2002, out=0x3000, stride_x=128, n=100, rows=3, alpha=0.5):
    return [x, y, out, stride_x, n, rows, alpha]


@pytest.fixture
def target(tiny_artifacts):
    return artifacts.TargetArtifacts("sm90", tiny_artifacts / "sm90",
                                     __import__("aotc.loader.manifest", fromlist=["x"]).read_manifest(tiny_artifacts / "sm90"))


def test_aligned_call_gets_the_specialized_binary(target):
    spec = get_spec("tiny_axpy")
    res = dispatch.resolve(spec, AXES, target.entries, values())
    assert res.level == ALIGNED and res.entry.divisible == ["x", "out", "stride_x"]


def test_y_is_never_specialized_so_its_alignment_does_not_matter(target):
    res = dispatch.resolve(get_spec("tiny_axpy"), AXES, target.entries, values(y=0x2001))
    assert res.level == ALIGNED


@pytest.mark.parametrize("change, reason", [
    (dict(x=0x1002), "x: data_ptr 4098 is not divisible by 16"),
    (dict(out=0x3008), "out: data_ptr"),
    (dict(stride_x=1), "stride_x: value 1 is not divisible by 16"),  # unit stride
    (dict(stride_x=100), "stride_x: value 100"),
])
def test_misaligned_or_unit_stride_call_gets_the_generic_binary(target, change, reason):
    res = dispatch.resolve(get_spec("tiny_axpy"), AXES, target.entries, values(**change))
    assert res.level == GENERIC and res.entry.divisible == []
    assert reason in res.rejected[ALIGNED]


def test_an_int_past_int32_fits_no_binary(target):
    res = dispatch.resolve(get_spec("tiny_axpy"), AXES, target.entries, values(n=2 ** 31))
    assert res.level is None and "does not fit in int32" in res.rejected[GENERIC]


def test_a_key_that_was_not_built_is_a_miss_with_reasons(target):
    res = dispatch.resolve(get_spec("tiny_axpy"), {"block": 256, "dtype": "fp16"}, target.entries, values())
    assert res.level is None
    assert res.rejected == {ALIGNED: "tiny_axpy(block=256,dtype=fp16)@aligned is not built",
                            GENERIC: "tiny_axpy(block=256,dtype=fp16)@generic is not built"}


def _slots_to_values(slots):
    x, y, out = (struct.unpack("<Q", s)[0] for s in slots[:3])
    ints = [struct.unpack("<i", s[:4])[0] for s in slots[3:6]]
    alpha = struct.unpack("<f", slots[6][:4])[0]
    scratch = [struct.unpack("<Q", s)[0] for s in slots[7:9]]
    return [x, y, out, *ints, alpha], scratch


def test_selection_launches_what_resolve_chooses_with_packed_arguments(target, fake_driver):
    spec = get_spec("tiny_axpy")
    sel = dispatch.Selection(spec, AXES, 0, target, (9, 0))
    args = [FakeTensor(0x1000), FakeTensor(0x2002), FakeTensor(0x3000), 128, 100, 3, 0.5]
    sel.launch((3, 1, 1), args, stream=77)
    sel.launch((5, 2, 1), [FakeTensor(0x1008), *args[1:]], stream=78)  # misaligned x
    sel.launch((3, 1, 1), args, stream=79)
    assert [l[1] for l in fake_driver.loaded] == [target.entries[f"tiny_axpy(block=64,dtype=fp16)@{lvl}"].sha256
                                                  for lvl in ("aligned", "generic")]  # each loaded once
    (f1, g1, b1, sh1, st1, s1), (f2, g2, _, _, st2, s2), (f3, *_rest) = fake_driver.launches
    assert f1 == f3 != f2 and g1 == (3, 1, 1) and g2 == (5, 2, 1) and b1 == (128, 1, 1) and (st1, st2) == (77, 78)
    vals, scratch = _slots_to_values(s1)
    assert vals == [0x1000, 0x2002, 0x3000, 128, 100, 3, 0.5] and scratch == [0, 0]
    assert _slots_to_values(s2)[0][0] == 0x1008


def test_a_tampered_binary_is_refused_before_it_is_loaded(tiny_artifacts, tmp_path, fake_driver):
    import shutil

    from aotc.loader.manifest import read_manifest

    shutil.copytree(tiny_artifacts / "sm90", tmp_path / "sm90")
    target = artifacts.TargetArtifacts("sm90", tmp_path / "sm90", read_manifest(tmp_path / "sm90"))
    entry = target.entries["tiny_axpy(block=64,dtype=fp16)@aligned"]
    path = tmp_path / "sm90" / entry.path
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))
    sel = dispatch.Selection(get_spec("tiny_axpy"), AXES, 0, target, (9, 0))
    with pytest.raises(ManifestError, match="damaged or altered"):
        sel.launch((1, 1, 1), [FakeTensor(0x1000), FakeTensor(0x2000), FakeTensor(0x3000), 16, 1, 1, 1.0], 0)
    assert fake_driver.loaded == [] and fake_driver.launches == []


def test_device_capability_picks_its_target():
    assert artifacts.candidate_targets((9, 0)) == ["sm90"]
    assert artifacts.candidate_targets((8, 6)) == ["sm86", "sm85", "sm84", "sm83", "sm82", "sm81", "sm80"]
    assert artifacts.candidate_targets((8, 0)) == ["sm80"]


def test_load_target_reads_the_source_folder(tiny_artifacts, monkeypatch):
    monkeypatch.setenv("AOTC_ARTIFACTS", str(tiny_artifacts))
    artifacts.set_artifacts(None)
    assert artifacts.load_target((8, 9)).name == "sm80"
    assert artifacts.load_target((9, 0)).name == "sm90"
    assert artifacts.load_target((10, 0)) is None
    artifacts.set_artifacts(None)


def test_the_generated_hot_path_agrees_with_resolve(target, fake_driver):
    import random

    spec = get_spec("tiny_axpy")
    sel = dispatch.Selection(spec, AXES, 0, target, (9, 0))
    rng = random.Random(0)
    for _ in range(200):
        vals = values(x=0x1000 + rng.choice([0, 2, 8, 16, 48]), y=0x2000 + rng.choice([0, 2]),
                      out=0x3000 + rng.choice([0, 4, 32]), stride_x=rng.choice([1, 16, 33, 64, 0]))
        args = [FakeTensor(v) if i < 3 else v for i, v in enumerate(vals)]
        packed, misaligned = sel.values(args)
        assert list(packed) == vals
        expected = dispatch.resolve(spec, AXES, target.entries, vals).level
        assert ("aligned" if not misaligned else "generic") == expected


def _install(spec, axes, target):
    """What run_kernel's first call on device 0 of an sm90 GPU would have set up."""
    dispatch._selections[(spec.name, tuple(axes.items()), 0)] = dispatch.Selection(spec, axes, 0, target, (9, 0))


def test_a_prepared_launch_packs_its_ints_once_and_its_pointers_per_call(target, fake_driver):
    spec = get_spec("tiny_axpy")
    _install(spec, AXES, target)
    prep = dispatch.prepare(spec, AXES, (3, 1, 1), [128, 100, 3, 0.5], device=0)
    assert prep is not None and prep.use_aligned
    prep((0x1000, 0x2002, 0x3000), 77)
    prep((0x1008, 0x2002, 0x3000), 78)  # x misaligned: the generic binary, same ints
    (f1, g1, b1, _, st1, s1), (f2, g2, _, _, st2, s2) = fake_driver.launches
    entries = target.entries
    assert [l[1] for l in fake_driver.loaded] == [entries[f"tiny_axpy(block=64,dtype=fp16)@{level}"].sha256
                                                  for level in ("aligned", "generic")]
    assert (f1, f2) == (1001, 1002)  # the fake driver numbers functions in load order
    assert (g1, g2, b1, st1, st2) == ((3, 1, 1), (3, 1, 1), (128, 1, 1), 77, 78)
    assert _slots_to_values(s1) == ([0x1000, 0x2002, 0x3000, 128, 100, 3, 0.5], [0, 0])
    assert _slots_to_values(s2) == ([0x1008, 0x2002, 0x3000, 128, 100, 3, 0.5], [0, 0])


def test_a_prepared_pdl_binary_is_launched_with_its_attribute_on_the_call_stream(target, fake_driver):
    """A binary built with launch_pdl (decode's merge on sm90) keeps the fast path: one
    cuLaunchKernelEx with the programmatic-stream-serialization attribute, on each call's stream."""
    from dataclasses import replace

    from aotc.loader import cuda_driver

    class PdlManifest:
        def __init__(self, inner):
            self.inner = inner

        def get(self, key):
            e = self.inner.get(key)
            return e and replace(e, launch_pdl=True)

    spec = get_spec("tiny_axpy")
    pdl = artifacts.TargetArtifacts("sm90", target.folder, PdlManifest(target.entries))
    _install(spec, AXES, pdl)
    prep = dispatch.prepare(spec, AXES, (3, 2, 1), [128, 100, 3, 0.5], device=0)
    assert prep is not None
    prep((0x1000, 0x2002, 0x3000), 77)
    prep((0x1000, 0x2002, 0x3000), 78)
    prep((0x1008, 0x2002, 0x3000), 79)  # the generic binary: its own config
    assert [(l[1], l[2][0], l[4]) for l in fake_driver.launches] == [((3, 2, 1), 128, 77), ((3, 2, 1), 128, 78),
                                                                     ((3, 2, 1), 128, 79)]
    pdl_attr = (cuda_driver.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, 1)
    assert fake_driver.ex_attributes == [[pdl_attr]] * 3
    assert _slots_to_values(fake_driver.launches[2][5]) == ([0x1008, 0x2002, 0x3000, 128, 100, 3, 0.5], [0, 0])
    assert len(prep.ex_configs) == 2  # built once per binary, not per call


def test_prepared_launches_choose_as_resolve_does(target, fake_driver):
    import random

    spec = get_spec("tiny_axpy")
    _install(spec, AXES, target)
    rng = random.Random(1)
    for _ in range(100):
        vals = values(x=0x1000 + rng.choice([0, 2, 8, 16]), y=0x2000 + rng.choice([0, 2]),
                      out=0x3000 + rng.choice([0, 4, 32]), stride_x=rng.choice([1, 16, 33, 64, 0]))
        prep = dispatch.prepare(spec, AXES, (1, 1, 1), vals[3:], device=0)
        fake_driver.launches.clear()
        prep(tuple(vals[:3]), 0)
        chosen = prep.sel.l_aligned if fake_driver.launches[0][0] == getattr(prep.sel.l_aligned, "function", 0) \
            else prep.sel.l_generic
        assert chosen.entry.key.endswith(dispatch.resolve(spec, AXES, target.entries, vals).level)


def test_prepare_declines_what_only_run_kernel_can_do(target, fake_driver):
    spec = get_spec("tiny_axpy")
    _install(spec, AXES, target)
    _install(spec, {"block": 256, "dtype": "fp16"}, target)
    assert dispatch.prepare(spec, AXES, (0, 1, 1), [128, 100, 3, 0.5], device=0) is None  # empty grid
    assert dispatch.prepare(spec, {"block": 256, "dtype": "fp16"}, (1, 1, 1), [128, 100, 3, 0.5], 0) is None  # JIT
    assert dispatch.prepare(spec, AXES, (1, 1, 1), [128, 2 ** 31, 3, 0.5], device=0) is None  # past int32
    assert fake_driver.loaded == []


def test_reset_empties_registered_plan_caches():
    cache = dispatch.register_plan_cache({"some": "plan"})
    dispatch.reset()
    assert cache == {}


def test_programs_per_sm_asks_the_driver_once_for_the_binary_the_ints_select(target, fake_driver, monkeypatch):
    spec = get_spec("tiny_axpy")
    sel = dispatch.Selection(spec, AXES, 0, target, (9, 0))
    monkeypatch.setattr(dispatch, "_selection", lambda spec, axes, device: sel)
    args = [FakeTensor(0x1000), FakeTensor(0x2000), FakeTensor(0x3000), 128, 100, 3, 0.5]
    assert dispatch.programs_per_sm(spec, AXES, args, 0) == 3
    assert dispatch.programs_per_sm(spec, AXES, args, 0) == 3
    (device, function, block, shared), = fake_driver.occupancy_calls  # cached on the loaded binary
    assert device == 0 and block == 128
    assert [l[1] for l in fake_driver.loaded] == [target.entries["tiny_axpy(block=64,dtype=fp16)@aligned"].sha256]
    # An odd stride breaks the ALIGNED binary's assumption: the GENERIC one is asked.
    assert dispatch.programs_per_sm(spec, AXES, [*args[:3], 127, 100, 3, 0.5], 0) == 3
    assert len(fake_driver.occupancy_calls) == 2
    assert fake_driver.loaded[1][1] == target.entries["tiny_axpy(block=64,dtype=fp16)@generic"].sha256
