"""The variant table, its agreement with the kernel's decorator, the fp8 encoder, and what the
sm90/sm80 binaries contain (compiled in a subprocess on this CPU: Triton carries ptxas)."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from aotc.aot.triton_compat import check_consistency
from aotc.kernels.prefix_prefill import spec
from aotc.kernels.prefix_prefill.kernel import _fp32_to_e4m3_bits, prefix_prefill_kernel
from aotc.kernels.registry import get_spec
from aotc.kernels.variants import VariantKey
from tests.cpu.kernels.decorators import as_jit


def test_variant_count_and_keys():
    variants = list(spec.variants())
    # 96 float/fp8 (dtype x format x block_d x layout x score) + 42 int8/int4 (dtype x 3 scales x
    # block_d, nhd, plain scores) + 4 int4 "token_zp" (dtype x block_d 64, 128: vLLM's INT4_PER_TOKEN_HEAD)
    # + 4 int8 and 4 fp8 e4m3 per token at kv_align 4 (dtype x block_d 64, 128: vLLM's INT8_PER_TOKEN_HEAD
    # and FP8_PER_TOKEN_HEAD record).
    assert len(variants) == 150
    assert sorted((a["dtype"], a["block_d"]) for a in variants if a["scales"] == "token_zp") == [
        ("bf16", 64), ("bf16", 128), ("fp16", 64), ("fp16", 128)]
    aligned4 = [a for a in variants if "kv_align" in a]
    assert sorted((a["dtype"], a["block_d"], a["kv"], a["scales"], a["kv_align"]) for a in aligned4) == [
        ("bf16", 64, "fp8_e4m3", "token", 4), ("bf16", 64, "int8", "token", 4), ("bf16", 128, "fp8_e4m3", "token", 4),
        ("bf16", 128, "int8", "token", 4), ("fp16", 64, "fp8_e4m3", "token", 4), ("fp16", 64, "int8", "token", 4),
        ("fp16", 128, "fp8_e4m3", "token", 4), ("fp16", 128, "int8", "token", 4)]
    assert not any(a["kv"] == "fp8_e4m3" and a["scales"] == "token" for a in variants if "kv_align" not in a)
    assert not any(spec.ws_variant(a) for a in aligned4)  # the Gluon kernel copies 16 bytes: kernel.py's only
    assert not any(spec.ws_variant(a) for a in variants if a["scales"] == "token_zp")  # kernel.py's only
    keys = spec.PREFIX_PREFILL.keys()
    assert len(set(map(str, keys))) == 300
    assert all(VariantKey.parse(str(k)) == k for k in keys)
    assert get_spec("prefix_prefill") is spec.PREFIX_PREFILL


@pytest.mark.parametrize("addresses,want", [
    ([0, 132, 264 * 32, 264, 4224, 264 * 32, 264, 4224], 4),  # vLLM's record: V 4 bytes past 16, strides 8 mod 16
    ([0, 256, 4096, 256, 2048, 4096, 256, 2048], 16),  # 16-byte rows: the ALIGNED binary
    ([0, 130, 264 * 32, 264, 4224, 264 * 32, 264, 4224], 16),  # 2 bytes off: the plain GENERIC binary
])
def test_kv_align_4_only_for_4_byte_rows(addresses, want):
    axes = spec.axes_for("bf16", "int8", "token", 128, "nhd")
    assert spec.kv_align(axes, addresses) == want
    assert spec.kv_align(spec.axes_for("bf16", "int8", "group", 128, "nhd"), addresses) == 16
    assert spec.kv_align(spec.axes_for("bf16", "int8", "token", 256, "nhd"), addresses) == 16
    # fp8 per token has kv_align 4 binaries only: they serve 16-byte rows too (their ALIGNED level)
    assert spec.kv_align(spec.axes_for("bf16", "fp8_e4m3", "token", 128, "nhd"), addresses) == (4 if want == 4 or
                                                                                                 addresses[1] == 256 else 16)
    assert spec.kv_align(spec.axes_for("bf16", "fp8_e4m3", "none", 128, "nhd"), addresses) == 16


def test_fp8_per_token_runs_the_int8_word_tiles():
    axes = dict(spec.axes_for("bf16", "fp8_e4m3", "token", 128, "nhd"), kv_align=4)
    int8 = dict(axes, kv="int8")
    for arch in (80, 90):
        assert spec.launch(axes, arch) == spec.launch(int8, arch)
        cx = spec.PREFIX_PREFILL.compile_constexprs(axes, arch)
        assert {k: v for k, v in cx.items() if k != "KV_FORMAT"} == \
            {k: v for k, v in spec.PREFIX_PREFILL.compile_constexprs(int8, arch).items() if k != "KV_FORMAT"}
        assert (cx["KV_FORMAT"], cx["SCALES"]) == (1, 1)
    assert spec.tile(128, "fp8_e4m3", "token") == spec.tile(128, "int8") != spec.tile(128, "fp8_e4m3")
    assert not spec.ws_variant(axes)


def test_decorator_matches_declared_alignment():
    # the build's own check: argument names and order, each one's specialization switch (lengths
    # never specialize; aligned strides keep divisibility by 16)
    check_consistency(spec.PREFIX_PREFILL, as_jit(prefix_prefill_kernel))
    assert spec.PREFIX_PREFILL.args == spec.KERNEL_ARGS


@pytest.mark.parametrize("axes", list(spec.variants())[::7])
def test_constexprs_and_launch(axes):
    from aotc.loader import targets

    cx = spec.constexprs(axes)
    assert set(cx) | {"PTX"} == set(spec.CONSTEXPRS)  # PTX follows the target
    assert cx["BLOCK_D"] in spec.BLOCK_DS and cx["BLOCK_M"] % cx["BLOCK_N"] == 0
    if axes["kv"] == "int4":
        assert cx["BLOCK_D"] >= 64  # a 16-wide dot for each of the four channel parts
    for arch in (80, 90):
        cfg = spec.launch(axes, arch)
        assert cfg.num_warps in (4, 8) and cfg.num_stages in (2, 3)
    two_an_sm = axes["kv"] == "same" and axes["block_d"] == 128 and axes["layout"] == "nhd"
    for name, ptx in (("sm80", 1), ("sm90", 1), ("gfx942", 0), ("gfx90a", 0)):
        arch = targets.get(name).spec_arch()
        want = dict(cx, PTX=ptx, **({"BLOCK_N": 32} if two_an_sm and name == "sm90" else {}))
        assert spec.PREFIX_PREFILL.compile_constexprs(axes, arch) == want
        assert spec.PREFIX_PREFILL.launch_config(axes, arch) is not None  # every format on every target


@pytest.mark.parametrize("dtype", spec.DTYPES)
def test_fp16_bf16_d128_on_sm90_runs_128_x_32_tiles_two_programs_an_sm(dtype):
    from aotc.loader import targets

    def config(axes, name):
        arch = targets.get(name).spec_arch()
        cfg = spec.PREFIX_PREFILL.launch_config(axes, arch)
        return spec.PREFIX_PREFILL.compile_constexprs(axes, arch)["BLOCK_N"], cfg.num_warps, cfg.num_stages, cfg.maxnreg

    axes = {"dtype": dtype, "kv": "same", "scales": "none", "block_d": 128, "layout": "nhd", "score": "plain"}
    assert config(axes, "sm90") == (32, 8, 3, 128)
    assert config(axes, "sm80") == (64, 8, 2, 0)  # sm80 keeps 128 x 64 (not measured on an A100)
    assert config(axes, "gfx942")[:2] == (64, 8)
    for other in ({"kv": "fp8_e4m3"}, {"layout": "vllm"}, {"block_d": 64}, {"block_d": 256}):
        a = dict(axes, **other)
        assert config(a, "sm90")[0] == spec.tile(a["block_d"], a["kv"], a["scales"])[1] and config(a, "sm90")[3] == 0, other


@triton.jit
def _encode(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n, other=0.0)
    tl.store(Y + offs, _fp32_to_e4m3_bits(x).to(tl.uint8), mask=offs < n)


def test_fp8_encoder_matches_torch_bit_for_bit():
    # Every finite e4m3 value, the ties between neighbours, one fp32 step either side of them,
    # values past 448 (saturate), and random values.
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    codes = codes[codes.isfinite()].unique()
    mids = (codes[1:] + codes[:-1]) / 2
    x = torch.cat([codes, mids, torch.nextafter(mids, mids + 1), torch.nextafter(mids, mids - 1),
                   torch.randn(2000) * 40, torch.randn(500) * 0.01, torch.tensor([500.0, -1e6, 464.0, -0.0])])
    y = torch.empty(x.shape, dtype=torch.uint8)
    _encode[(1,)](x, y, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    want = x.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    bad = (y != want).nonzero().flatten()
    assert bad.numel() == 0, [(x[i].item(), y[i].item(), want[i].item()) for i in bad[:5]]


_COMPILE = textwrap.dedent("""
    import json, re, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from aotc.kernels.prefix_prefill import spec
    from aotc.kernels.prefix_prefill.kernel import prefix_prefill_kernel as fn
    axes, arch = json.loads(sys.argv[1]), int(sys.argv[2])
    s = spec.PREFIX_PREFILL
    sig = s.signature(axes)
    src = ASTSource(fn, {n: sig[n] for n in fn.arg_names},
                    constexprs={(fn.arg_names.index(k),): v for k, v in s.compile_constexprs(axes, arch).items()},
                    attrs={(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in s.divisible_args("aligned")})
    cfg = s.launch(axes, arch)
    k = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                       options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    ptx = k.asm["ptx"]
    print(json.dumps({"wgmma": ptx.count("wgmma.mma_async"), "mma": ptx.count("mma.sync"),
                      "cp16": len(re.findall(r"cp\\.async\\.cg\\.shared\\.global.*, 0x10", ptx)),
                      "v4": len(re.findall(r"ld\\.global[.a-z]*\\.v4", ptx)), "shared": k.metadata.shared}))
""")


def _compile(axes, arch):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps(axes), str(arch)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("head_dim", [8, 24, 40, 72, 112, 128, 192, 256])
def test_block_d_buckets(head_dim):
    bd = spec.block_d(head_dim)
    assert bd >= head_dim and (bd == 32 or bd // 2 < head_dim)
    assert spec.block_d(head_dim, "int4") == max(64, bd)


def test_sm90_binary_uses_wgmma_and_16_byte_loads():
    # head_dim is runtime and masked: with head_dim % 16 == 0 the mask must keep 16-byte vectors.
    got = _compile({"dtype": "bf16", "kv": "same", "scales": "none", "block_d": 128, "layout": "nhd",
                    "score": "plain"}, 90)
    assert got["wgmma"] > 0, got
    # K and V tiles arrive through 16-byte asynchronous copies (Q through 16-byte loads).
    assert got["cp16"] > 0 and got["v4"] > 0, got
    assert got["shared"] <= 227 * 1024


@pytest.mark.parametrize("score", ["plain", "mod"])
def test_sm80_binary_with_fp8_cache_compiles_to_mma(score):
    # fp8e4nv is not a type Triton accepts on sm80: the kernel decodes the bits itself. Softcap and
    # ALiBi ("mod") must not push the binary past sm80's 163 KiB of shared memory.
    axes = {"dtype": "fp16", "kv": "fp8_e4m3", "scales": "none", "block_d": 128, "layout": "vllm", "score": score}
    got = _compile(axes, 80)
    assert got["mma"] > 0, got
    assert got["shared"] <= 163 * 1024


@pytest.mark.parametrize("axes,arch", [
    ({"dtype": "bf16", "kv": "int8", "scales": "token", "block_d": 128, "layout": "nhd", "score": "plain"}, 90),
    ({"dtype": "fp16", "kv": "int4", "scales": "channel", "block_d": 256, "layout": "nhd", "score": "plain"}, 80),
])
def test_int_cache_binaries_compile_to_tensor_core_dots(axes, arch):
    # The dequantization is the packed PTX of kernels/common/dequant.py; the dots stay on tensor cores.
    got = _compile(axes, arch)
    assert got["wgmma" if arch >= 90 else "mma"] > 0, got
    assert got["shared"] <= (227 if arch >= 90 else 163) * 1024
