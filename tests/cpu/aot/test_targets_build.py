"""Building for targets beyond NVIDIA on the CPU: AMD code objects (Triton 3.6's HIP backend)
that `aotc verify` checks by ELF machine and gfx arch, per-target variant declarations, and an
Iluvatar build that stops before compiling anything where FlagTree's Triton is absent."""
import shutil
import struct
from dataclasses import replace

import pytest

from aotc.aot.build import build, plan_keys
from aotc.aot.elf import check_binary
from aotc.kernels.variants import KernelSpec, LaunchConfig, TargetArch
from aotc.loader import targets
from aotc.loader.manifest import Manifest, Target, read_manifest

from .conftest import run_cli


@pytest.fixture(scope="module")
def amd_artifacts(tmp_path_factory):
    out = tmp_path_factory.mktemp("amd")
    report = build(out, ["gfx942", "gfx90a"], kernels=["tiny_axpy"], jobs=2, progress=False)
    assert report.ok, report.failed
    assert len(report.compiled) == 16  # 4 variants x 2 levels x 2 targets
    return out


@pytest.mark.parametrize("gfx, mach", [("gfx942", 0x04C), ("gfx90a", 0x03F)])
def test_amd_binaries_are_amdgpu_elves_for_their_gfx(amd_artifacts, gfx, mach):
    m = read_manifest(amd_artifacts / gfx, expect_target=gfx)
    for e in m.entries:
        data = (amd_artifacts / gfx / e.path).read_bytes()
        assert struct.unpack_from("<H", data, 18)[0] == 224  # EM_AMDGPU
        assert struct.unpack_from("<I", data, 48)[0] & 0xFF == mach  # EF_AMDGPU_MACH
        problems, symbols = check_binary(data, targets.get(gfx))
        assert problems == [] and e.symbol in symbols and e.path.endswith(".hsaco")


def test_verify_and_list_read_amd_targets(amd_artifacts):
    r = run_cli("verify", amd_artifacts)
    assert r.returncode == 0 and "16 entries checked, 0 problems" in r.stdout, r.stdout + r.stderr
    r = run_cli("list", amd_artifacts)
    assert r.returncode == 0 and "gfx942: 8 binaries" in r.stdout and "gfx90a: 8 binaries" in r.stdout


def test_verify_catches_a_gfx90a_object_in_the_gfx942_folder_and_a_cubin_among_hsaco(
        amd_artifacts, tiny_artifacts, tmp_path):
    art = tmp_path / "art"
    shutil.copytree(amd_artifacts, art)
    m942, m90a = read_manifest(art / "gfx942"), read_manifest(art / "gfx90a")
    entries = m942.entries
    donor = m90a.entries[0]
    shutil.copy(art / "gfx90a" / donor.path, art / "gfx942" / donor.path)
    entries[0] = replace(entries[0], path=donor.path, sha256=donor.sha256, size=donor.size)
    cubin = read_manifest(tiny_artifacts / "sm90").entries[0]
    shutil.copy(tiny_artifacts / "sm90" / cubin.path, art / "gfx942" / cubin.path)
    entries[1] = replace(entries[1], path=cubin.path, sha256=cubin.sha256, size=cubin.size)
    (art / "gfx942" / "manifest.json").write_text(Manifest(m942.target, "0.2.0", m942.triton_version, entries).to_json())
    r = run_cli("verify", art)
    assert r.returncode == 1
    assert f"{entries[0].key}: {donor.path} is for gfx90a, manifest target is gfx942" in r.stderr
    assert entries[1].key in r.stderr and "e_machine 190 (CUDA), expected 224 (AMDGPU)" in r.stderr
    assert "is not a hsaco (.hsaco) file" in r.stderr


def test_verify_refuses_a_manifest_whose_target_record_is_not_the_tables(amd_artifacts, tmp_path):
    art = tmp_path / "art"
    shutil.copytree(amd_artifacts / "gfx942", art / "gfx942")
    m = read_manifest(art / "gfx942")
    relabelled = Manifest(Target("gfx942", "hip", "gfx942", 32), m.aotc_version, m.triton_version, m.entries)
    (art / "gfx942" / "manifest.json").write_text(relabelled.to_json())
    r = run_cli("verify", art)
    assert r.returncode == 1 and "warp size 32" in r.stderr and "Traceback" not in r.stderr


def test_ivcore_build_stops_before_compiling_naming_the_missing_package(tmp_path):
    r = run_cli("build", "--arch", "sm90", "--arch", "ivcore20", "--kernel", "tiny_axpy", "--out", tmp_path / "o")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "FlagTree's Triton" in r.stderr and "triton.backends.iluvatar" in r.stderr and "'flagtree'" in r.stderr
    assert "Nothing was compiled" in r.stderr and not (tmp_path / "o").exists()


def test_an_unknown_arch_is_a_usage_error(tmp_path):
    r = run_cli("build", "--arch", "gfx1100", "--out", tmp_path / "o")
    assert r.returncode == 2 and "unknown target 'gfx1100'" in r.stderr and "gfx942" in r.stderr


def _spec_only_on_cuda():
    """A spec declaring its fp32 variant for NVIDIA targets only (launch -> None elsewhere)."""
    from aotc.kernels.registry import get_spec

    tiny = get_spec("tiny_axpy")

    def launch(axes, arch):
        if axes["dtype"] == "fp32" and arch.backend != "cuda":
            return None
        return LaunchConfig(num_warps=4, num_stages=2, maxnreg=128, launch_pdl=arch >= 90)

    return KernelSpec(name=tiny.name, module=tiny.module, function=tiny.function, args=tiny.args,
                      constexpr_names=tiny.constexpr_names, constexprs=tiny.constexprs, variants=tiny.variants,
                      launch=launch, folder=str(tiny.folder))


def test_variants_are_declared_per_target_and_cuda_only_options_dropped_elsewhere():
    spec = _spec_only_on_cuda()
    gfx = targets.get("gfx942").spec_arch()
    sm90 = targets.get("sm90").spec_arch()
    assert isinstance(gfx, TargetArch) and int(gfx) == 0 and gfx.warp_size == 64
    assert len(spec.keys(sm90)) == 8 and len(spec.keys(gfx)) == 4
    assert all("dtype=fp16" in str(k) for k in spec.keys(gfx))
    axes = {"dtype": "fp16", "block": 64}
    assert spec.launch_config(axes, sm90) == LaunchConfig(4, 2, maxnreg=128, launch_pdl=True)
    assert spec.launch_config(axes, gfx) == LaunchConfig(4, 2)  # maxnreg/PDL are CUDA compile options
    assert spec.launch_config(axes, 80) == LaunchConfig(4, 2, maxnreg=128)  # a plain int: smN


def test_plan_keys_follow_the_registered_specs_per_target():
    # Every declared kernel: the AMD plan is the NVIDIA plan less what the specs leave out there.
    sm90 = {str(k) for _, k in plan_keys(None, None, Target.from_name("sm90"))}
    gfx = {str(k) for _, k in plan_keys(None, None, Target.from_name("gfx942"))}
    assert gfx <= sm90 and gfx
    # int8/int4/fp8 caches dequantize through inline PTX on CUDA and through plain Triton elsewhere
    # (the kernels' PTX constexpr), so every product variant is declared on AMD too: 954 a target
    # (the four-target build of 2026-11-25 in the README had 540 NVIDIA and 220 AMD ones; since
    # then the state pass's wide value tile added 8, prefix_prefill's per-group scales 28 NVIDIA,
    # and the portable dequantization 348 AMD ones, then fp32 gated delta 30: decode 12, chunk
    # precompute 12, state pass 6, prefix_prefill's softcap/ALiBi score axis 96; decode's
    # looping merge past 64 splits 16; vLLM variants 80: softcap/ALiBi and its per-token-head caches;
    # their kv_align 8 reads 32; the 256-split merge tile 16; vLLM's INT4_PER_TOKEN_HEAD: decode's
    # int4_zp 12 and prefix_prefill's token_zp 8, then decode's int4_rht (rotations in the kernel) 12;
    # gated delta decode's gate axis 36; KDA's
    # precompute as three kernels of its own: 54, less gdn_chunk_prep's 18 KDA keys; prefix_prefill's kv_align 4
    # reads of vLLM's int8 record 8, and of its fp8 per-token record 8; gated delta decode's packed
        # V-major tiles and one-token binaries 72; its long GDN loops at K = 128 12), plus on sm90
    # the Gluon prefix-prefill kernels' 12 + 6 ALIGNED keys (kernel_ws_rec.py's 6: keys read from the
    # cache) and the Gluon gated delta state pass's 8.
    assert any("kv=int8" in k for k in gfx if k.startswith("prefix_prefill"))
    assert any("kv=int4" in k for k in gfx if k.startswith("decode_split"))
    product = ("decode_", "prefix_prefill", "gated_delta_decode", "gdn_chunk_", "kda_chunk_")  # not the tiny kernel
    assert (len([k for k in sm90 if k.startswith(product)]), len([k for k in gfx if k.startswith(product)])) == (1076, 1050)
    # the MLA family is declared for NVIDIA targets only (kernels/decode/mla_spec.py)
    assert sm90 - gfx == {k for k in sm90 if k.startswith(("prefix_prefill_ws(", "prefix_prefill_ws_rec(",
                                                            "gdn_chunk_state_ws(", "mla_"))}
    sm80 = {str(k) for _, k in plan_keys(None, None, Target.from_name("sm80"))}
    assert sm80 and not any(k.startswith(("prefix_prefill_ws(", "prefix_prefill_ws_rec(", "gdn_chunk_state_ws("))
                            for k in sm80)
