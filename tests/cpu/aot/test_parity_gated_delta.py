"""The AOT binaries of one key of each gated delta kernel (the recurrent decode, and the chunked
prefill's state pass) are byte-identical to what Triton's JIT compiles for calls with that key's
specialization (aligned call -> @aligned, misaligned call -> @generic), as test_parity.py checks
for the tiny kernel; the state pass at both value tiles (bv 32 and 128); fp32 keys of both; the
decode's packed one-token key and its long packed loop (split rows); KDA's three precompute kernels.
Each kernel's JIT calls are in its script (jit_sha_gated_delta*.py)."""
import importlib
import os
import subprocess
import sys

import pytest

from aotc.aot.build import build
from aotc.kernels.variants import VariantKey
from aotc.loader.manifest import read_manifest

from .conftest import REPO

# case -> (kernel, script, the script's extra arguments, the name of its axes there)
CASES = {"gated_delta_decode": ("gated_delta_decode", "tests.cpu.aot.jit_sha_gated_delta", [], "AXES"),
         "gdn_chunk_state_bv32": ("gdn_chunk_state", "tests.cpu.aot.jit_sha_gated_delta_chunk", ["32"], "AXES"),
         "gdn_chunk_state_bv128": ("gdn_chunk_state", "tests.cpu.aot.jit_sha_gated_delta_chunk", ["128"], "WIDE"),
         # fp32 inputs (tf32x3 dots, two stages) and, misaligned, head sizes inside the 128 tile
         "gated_delta_decode_fp32": ("gated_delta_decode", "tests.cpu.aot.jit_sha_gated_delta", ["fp32"], "FP32"),
         # the packed one-token tile: constant tile offsets, no token loop
         "gated_delta_decode_packed1": ("gated_delta_decode", "tests.cpu.aot.jit_sha_gated_delta", ["packed1"],
                                        "PACKED1"),
         # the long packed token loop: K = 128 state rows in two parts a thread (spec.k_split)
         "gated_delta_decode_long": ("gated_delta_decode", "tests.cpu.aot.jit_sha_gated_delta", ["long"], "LONG"),
         "gdn_chunk_state_fp32": ("gdn_chunk_state", "tests.cpu.aot.jit_sha_gated_delta_chunk", ["32", "fp32"],
                                  "FP32"),
         # KDA's precompute: the diagonal blocks (3D elementwise tiles), the blocks below them
         # (small dots), the inverse and W/U
         "kda_chunk_intra": ("kda_chunk_intra", "tests.cpu.aot.jit_sha_gated_delta_kda", ["kda_chunk_intra"], "A_AXES"),
         "kda_chunk_inter": ("kda_chunk_inter", "tests.cpu.aot.jit_sha_gated_delta_kda", ["kda_chunk_inter"], "A_AXES"),
         "kda_chunk_wy": ("kda_chunk_wy", "tests.cpu.aot.jit_sha_gated_delta_kda", ["kda_chunk_wy"], "WY_AXES")}


# The state pass's GENERIC binaries are a spec of their own (chunk_spec.GDN_CHUNK_STATE_GENERIC).
GENERIC_SPEC = {"gdn_chunk_state": "gdn_chunk_state_generic"}


def _key(case, level="aligned"):
    kernel, script, _, axes = CASES[case]
    name = GENERIC_SPEC.get(kernel, kernel) if level == "generic" else kernel
    return VariantKey.make(name, getattr(importlib.import_module(script), axes), level)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    out = tmp_path_factory.mktemp("gdn-artifacts")
    # The miss-log path builds exactly these keys (both levels); kernels= keeps the rest of the
    # table out (the tiny fixture kernel: two binaries a target).
    misses = [(_key(c, level), None) for c in CASES for level in ("aligned", "generic")]
    report = build(out, ["sm80", "sm90"], kernels=["tiny_axpy"], misses=misses,
                   jobs=2, progress=False)
    assert report.ok, report.failed
    return out


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("target", ["sm80", "sm90"])
def test_jit_compiles_the_same_bytes_as_the_build(artifacts, case, target, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    _, script, extra, _ = CASES[case]
    out = subprocess.run([sys.executable, "-m", script, target[2:], *extra], capture_output=True, text=True,
                         cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    jit_aligned, jit_generic = out.stdout.split()
    entries = read_manifest(artifacts / target).by_key()
    assert entries[str(_key(case))].sha256 == jit_aligned
    assert entries[str(_key(case, "generic"))].sha256 == jit_generic
    assert jit_aligned != jit_generic


def test_jit_fallback_compiles_a_partly_aligned_call_as_the_generic_build(artifacts, tmp_path):
    # 16-byte-aligned pointers beside head sizes off 16 (K = 127): dispatch serves the call with the
    # GENERIC binary, so the loader's JIT fallback must compile that key's bytes; Triton's own JIT
    # specializes the aligned pointers (another binary: on the H100 its fp32 outputs at K = 100 were
    # a few ulps off the built ones).
    from aotc.kernels.gated_delta import chunk_spec
    from aotc.loader.dispatch import Selection

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    out = subprocess.run([sys.executable, "-m", "tests.cpu.aot.jit_sha_gated_delta_chunk", "90", "32", "bf16",
                          "partial"], capture_output=True, text=True, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    plain, fallback = out.stdout.split()
    entries = read_manifest(artifacts / "sm90").by_key()
    assert entries[str(_key("gdn_chunk_state_bv32", "generic"))].sha256 == fallback
    assert plain != fallback
    # the level the fallback is given: what dispatch would serve (pointers read by data_ptr())
    from tests.cpu.aot.jit_sha_gated_delta_chunk import args as call_args

    sel = Selection.__new__(Selection)
    # the GENERIC spec builds no ALIGNED level; the ALIGNED one no GENERIC (the op routes by alignment)
    for spec, call, level in ((chunk_spec.GDN_CHUNK_STATE_GENERIC, call_args(True), "generic"),
                              (chunk_spec.GDN_CHUNK_STATE, call_args(True), "aligned"),
                              (chunk_spec.GDN_CHUNK_STATE, call_args(False, pointers_aligned=True), "aligned")):
        sel.spec = spec
        assert sel.level_of(call) == level, (spec.name, level)
