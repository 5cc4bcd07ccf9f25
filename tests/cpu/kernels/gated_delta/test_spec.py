"""The decode kernel's variant table, its agreement with the kernel's decorator, and what the
sm90 binaries contain (compiled in a subprocess on this CPU: Triton carries ptxas)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from aotc.aot.triton_compat import check_consistency
from aotc.kernels.gated_delta import spec
from aotc.kernels.gated_delta.recurrent import gated_delta_decode_kernel
from aotc.kernels.registry import get_spec
from aotc.kernels.variants import VariantKey
from tests.cpu.kernels.decorators import as_jit


def test_variant_count_and_keys():
    variants = list(spec.variants())
    # dtype 3 x K tile 3 x gate 2 x (V-major: strided, packed, packed one-token; K-major: strided),
    # and dtype 3 x the long GDN loop at K = 128 in each layout
    assert len(variants) == 78
    assert sum(v["layout"] == "kmajor" for v in variants) == 21
    assert all(v["rows"] == "packed" or v["tokens"] != "one" for v in variants)
    long = [v for v in variants if v["tokens"] == "long"]
    assert {(v["k_dim"], v["gate"], v["layout"], v["rows"]) for v in long} == {
        (128, "gdn", "vmajor", "packed"), (128, "gdn", "kmajor", "strided")} and len(long) == 6
    keys = spec.DECODE.keys()
    assert len(set(map(str, keys))) == 156
    assert all(VariantKey.parse(str(k)) == k for k in keys)
    assert get_spec("gated_delta_decode") is spec.DECODE


def test_packed_rows_and_one_token_forms():
    # packed: a V-major pool whose K is a built tile, rows K apart and V a multiple of a program's rows
    assert spec.rows_form("vmajor", 128, 128, 128, "gdn") == "packed"
    assert spec.rows_form("vmajor", 64, 48, 64, "gdn") == "packed"  # BV 16 divides 48
    assert spec.rows_form("vmajor", 64, 40, 64, "gdn") == "strided"  # a partial value tile
    assert spec.rows_form("vmajor", 100, 128, 100, "gdn") == "strided"  # K inside the 128 tile
    assert spec.rows_form("vmajor", 128, 128, 144, "gdn") == "strided"  # padded rows
    assert spec.rows_form("kmajor", 128, 128, 128, "gdn") == "strided"
    assert [spec.tokens_form(r, t) for r in spec.ROWS for t in (1, 2)] == ["any", "any", "one", "any"]
    # the long loop: GDN at K = 128 from LONG_FROM tokens (V-major: packed rows only)
    lv, lk = spec.LONG_FROM["vmajor"], spec.LONG_FROM["kmajor"]
    assert spec.tokens_form("packed", lv, "vmajor", 128, "gdn") == "long"
    assert spec.tokens_form("packed", lv - 1, "vmajor", 128, "gdn") == "any"
    assert spec.tokens_form("strided", 8, "vmajor", 128, "gdn") == "any"
    assert spec.tokens_form("strided", lk, "kmajor", 128, "gdn") == "long"
    assert spec.tokens_form("strided", lk - 1, "kmajor", 128, "gdn") == "any"
    assert spec.tokens_form("packed", 8, "vmajor", 128, "kda") == "any"
    assert spec.tokens_form("packed", 8, "vmajor", 64, "gdn") == "any"
    cx = spec.constexprs(spec.axes_for("bf16", 128, "vmajor", "gdn", "packed", "long"))
    assert (cx["PACKED"], cx["NT"], cx["KS"]) == (1, 0, 2)
    assert [spec.group_shift(g) for g in (1, 2, 3, 4, 6, 8, 64)] == [0, 1, -1, 2, -1, 3, 6]
    cx = spec.constexprs(spec.axes_for("bf16", 128, "vmajor", "gdn", "packed", "one"))
    assert (cx["PACKED"], cx["NT"]) == (1, 1)


def test_block_k_rounds_head_sizes_up_to_a_built_tile():
    assert [spec.block_k(k) for k in (1, 60, 64, 65, 100, 128, 129, 256)] == [64, 64, 64, 128, 128, 128, 256, 256]


def test_decorator_matches_declared_alignment():
    # the build's own check: argument names and order, each one's specialization switch
    check_consistency(spec.DECODE, as_jit(gated_delta_decode_kernel))
    assert spec.DECODE.args == spec.ARGS
    # Every pointer comes before every scalar: a prepared launch.Launch packs only the leading pointers.
    assert spec.DECODE.leading_ptrs == sum(a.kind == "ptr" for a in spec.ARGS)


@pytest.mark.parametrize("axes", list(spec.variants()))
def test_tiles_hold_32_floats_a_thread_and_divide_v(axes):
    cx = spec.constexprs(axes)
    cfg = spec.launch(axes, 90)
    assert cx["BV"] * cx["BK"] == 32 * 32 * cfg.num_warps
    assert cx["BV"] & (cx["BV"] - 1) == 0 and cx["KMAJOR"] == (axes["layout"] == "kmajor")
    assert cx["PER_K"] == (axes["gate"] == "kda")
    if (axes["layout"], axes["gate"]) == ("kmajor", "kda"):
        assert cx["BV"] * 4 >= 128  # each K row of the 4-warp K-major tile is a full 128-byte line
    else:
        assert cfg.num_warps == 1  # every reduction inside the warp
    assert cfg.maxnreg == spec.max_registers(axes["k_dim"], axes["layout"], axes["gate"], axes["rows"], axes["tokens"])
    assert spec.launch(axes, 80) == cfg
    assert spec.grid(3, 5, 80, cx["BV"]) == (-(-80 // cx["BV"]), 5, 3)  # V tiles, HV, B: no division


def test_one_token_k_major_gdn_runs_the_kda_tile():
    assert spec.binary_gate("gdn", "kmajor", 1, False) == "kda"
    assert spec.binary_gate("gdn", "kmajor", 1, True) == "kda"  # the fused form too
    assert spec.binary_gate("gdn", "kmajor", 2, False) == "gdn"
    assert [spec.binary_gate(g, "vmajor", t, f) for g in spec.GATES for t in (1, 4) for f in (False, True)] == \
        ["gdn"] * 4 + ["kda"] * 4
    assert spec.binary_gate("kda", "kmajor", 1, False) == "kda"


_COMPILE = textwrap.dedent("""
    import json, os, re, subprocess, sys, tempfile
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from aotc.kernels.gated_delta import spec
    from aotc.kernels.gated_delta.recurrent import gated_delta_decode_kernel as fn
    axes, arch = json.loads(sys.argv[1]), int(sys.argv[2])
    s = spec.DECODE
    sig = s.signature(axes)
    src = ASTSource(fn, {n: sig[n] for n in fn.arg_names},
                    constexprs={(fn.arg_names.index(k),): v for k, v in s.constexprs(axes).items()},
                    attrs={(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in s.divisible_args("aligned")})
    k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=s.launch(axes, arch).triton_options())
    ptx = k.asm["ptx"]
    with tempfile.TemporaryDirectory() as d:  # ptxas's own account of registers and spills
        open(os.path.join(d, "k.ptx"), "w").write(ptx)
        ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
        info = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{arch}a", os.path.join(d, "k.ptx"), "-o",
                               os.path.join(d, "k.cubin")], capture_output=True, text=True).stderr
    print(json.dumps({"ld_v4": len(re.findall(r"ld\\.global[.a-z0-9]*\\.v4\\.b32", ptx)),
                      "st_v4": len(re.findall(r"st\\.global[.a-z0-9]*\\.v4\\.b32", ptx)),
                      "local": ptx.count("ld.local") + ptx.count("st.local"), "shared": k.metadata.shared,
                      "regs": int(re.search(r"Used (\\d+) registers", info).group(1)),
                      "spill": int(re.search(r"(\\d+) bytes spill stores", info).group(1))}))
""")


SM90_CASES = [("vmajor", "gdn", "strided", "any"), ("kmajor", "gdn", "strided", "any"),
              ("kmajor", "kda", "strided", "any"), ("vmajor", "gdn", "packed", "any"),
              ("vmajor", "gdn", "packed", "one"), ("vmajor", "kda", "packed", "one"),
              ("vmajor", "gdn", "packed", "long"), ("kmajor", "gdn", "strided", "long")]


@pytest.mark.parametrize("layout,gate,rows,tokens", SM90_CASES)
def test_sm90_state_moves_in_16_byte_vectors(layout, gate, rows, tokens):
    # 32 fp32 state values a thread: 8 vector loads and 8 vector stores, no scalar fallback,
    # nothing in local memory in the PTX; ptxas holds the register cap, and V-major (the pool
    # SGLang and vLLM keep) spills nothing under it. The packed one-token GDN step fits 64
    # registers: 32 one-warp programs an SM.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    axes = spec.axes_for("bf16", 128, layout, gate, rows, tokens)
    res = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps(axes), "90"], env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["ld_v4"] >= 8 and got["st_v4"] == 8, got
    assert got["local"] == 0, got
    cap = spec.max_registers(128, layout, gate, rows, tokens)
    assert got["regs"] <= (cap or 255), got
    if layout == "vmajor":
        assert got["spill"] == 0, got
    if (gate, rows, tokens) == ("gdn", "packed", "one"):
        assert got["regs"] <= 64, got
