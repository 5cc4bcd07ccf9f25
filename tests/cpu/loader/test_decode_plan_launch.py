"""A plan's launches (launch.Launch with fixed pointers, as split_merge.Bound uses it) through a
fake driver, no GPU: the plan's fixed
pointers are packed once, each run packs only its own, the ALIGNED or GENERIC binary is chosen by
the call's pointers, and a dependent-launch (PDL) binary goes through cuLaunchKernelEx on the
run's stream. On the tiny fixture kernel (pointers x, y, out; then ints), out standing for a
pointer the plan fixes."""
from dataclasses import replace

from aotc.kernels.registry import get_spec
from aotc.loader import artifacts, cuda_driver, dispatch
from aotc.loader.manifest import read_manifest

from .test_dispatch import AXES, _install, _slots_to_values


def _target(tiny_artifacts):
    return artifacts.TargetArtifacts("sm90", tiny_artifacts / "sm90", read_manifest(tiny_artifacts / "sm90"))


def test_plan_launch_packs_fixed_pointers_once_and_per_run_ones(tiny_artifacts, fake_driver):
    target = _target(tiny_artifacts)
    spec = get_spec("tiny_axpy")
    _install(spec, AXES, target)
    prep = dispatch.prepare(spec, AXES, (3, 1, 1), [128, 100, 3, 0.5], device=0)
    launch = prep
    launch.fix({2: 0x3000})  # out fixed by the plan; x, y per run
    launch.per_call(0, 2)
    launch.pack(launch.buffer, launch.offset, 0x1000, 0x2002)
    launch.go(True)(77)
    launch.pack(launch.buffer, launch.offset, 0x1008, 0x2002)
    launch.go(False)(78)  # x misaligned: the generic binary
    launch.pack(launch.buffer, launch.offset, 0x1010, 0x2002)
    launch.go(True)(79)
    (f1, g1, b1, _, st1, s1), (f2, _, _, _, st2, s2), (f3, _, _, _, st3, s3) = fake_driver.launches
    assert (f1, f2, f3) == (1001, 1002, 1001) and (st1, st2, st3) == (77, 78, 79) and g1 == (3, 1, 1)
    assert _slots_to_values(s1) == ([0x1000, 0x2002, 0x3000, 128, 100, 3, 0.5], [0, 0])
    assert _slots_to_values(s2) == ([0x1008, 0x2002, 0x3000, 128, 100, 3, 0.5], [0, 0])
    assert _slots_to_values(s3) == ([0x1010, 0x2002, 0x3000, 128, 100, 3, 0.5], [0, 0])
    assert launch.go(True) is launch.go(True)  # resolved once


def test_plan_launch_of_a_pdl_binary_uses_launch_ex_on_the_run_stream(tiny_artifacts, fake_driver):
    class PdlManifest:
        def __init__(self, inner):
            self.inner = inner

        def get(self, key):
            e = self.inner.get(key)
            return e and replace(e, launch_pdl=True)

    target = _target(tiny_artifacts)
    spec = get_spec("tiny_axpy")
    _install(spec, AXES, artifacts.TargetArtifacts("sm90", target.folder, PdlManifest(target.entries)))
    prep = dispatch.prepare(spec, AXES, (3, 2, 1), [128, 100, 3, 0.5], device=0)
    launch = prep
    launch.fix({0: 0x1000, 1: 0x2002})  # x, y fixed; out per run
    launch.per_call(2, 1)
    for out, stream in ((0x3000, 81), (0x3010, 82)):
        launch.pack(launch.buffer, launch.offset, out)
        launch.go(True)(stream)
    assert [(l[1], l[4]) for l in fake_driver.launches] == [((3, 2, 1), 81), ((3, 2, 1), 82)]
    pdl_attr = (cuda_driver.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, 1)
    assert fake_driver.ex_attributes == [[pdl_attr]] * 2
    assert _slots_to_values(fake_driver.launches[1][5]) == ([0x1000, 0x2002, 0x3010, 128, 100, 3, 0.5], [0, 0])


def test_prepare_an_aligned_only_spec_only_when_asked(tiny_artifacts, fake_driver):
    """A spec built at the ALIGNED level alone (gated_delta_prefill's state pass) is prepared only
    with aligned_only=True, launches its one binary, and says which pointers it cannot take."""
    class AlignedOnly:
        def __init__(self, inner):
            self.inner = inner

        def get(self, key):
            return None if key.endswith("@generic") else self.inner.get(key)

    target = _target(tiny_artifacts)
    spec = get_spec("tiny_axpy")
    _install(spec, AXES, artifacts.TargetArtifacts("sm90", target.folder, AlignedOnly(target.entries)))
    assert dispatch.prepare(spec, AXES, (3, 1, 1), [128, 100, 3, 0.5], device=0) is None
    launch = dispatch.prepare(spec, AXES, (3, 1, 1), [128, 100, 3, 0.5], device=0, aligned_only=True)
    assert launch is not None and launch.misaligned((0x1008, 0x2000, 0x3000))
    assert not launch.misaligned((0x1000, 0x2000, 0x3000))
    launch((0x1000, 0x2000, 0x3000), 79)
    (function, _, _, _, stream, slots), = fake_driver.launches
    assert function == 1001 and stream == 79
    assert _slots_to_values(slots) == ([0x1000, 0x2000, 0x3000, 128, 100, 3, 0.5], [0, 0])
    # ints that break the ALIGNED binary's assumptions (a stride off 16): nothing to launch
    assert dispatch.prepare(spec, AXES, (3, 1, 1), [120, 100, 3, 0.5], device=0, aligned_only=True) is None
