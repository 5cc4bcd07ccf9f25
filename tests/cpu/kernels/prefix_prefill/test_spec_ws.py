"""The warp-specialized Gluon kernel's variant table, the rule that routes calls to it, its
agreement with the Triton kernel's parameters, and what its sm90 binary contains (compiled in a
subprocess on this CPU). Its numerics run on the GPU only (Gluon has no interpreter):
tests/gpu/test_prefix_prefill.py."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from aotc.aot.triton_compat import check_consistency, jit_function
from aotc.kernels.prefix_prefill import spec
from aotc.kernels.registry import get_spec
from aotc.kernels.variants import ALIGNED
from aotc.loader import targets
from aotc.loader.ops import prefix_prefill as pp_op

WS = spec.PREFIX_PREFILL_WS
INT8_D128 = {"dtype": "bf16", "kv": "int8", "scales": "token", "block_d": 128, "layout": "nhd"}


def test_variants_keys_and_targets():
    assert get_spec("prefix_prefill_ws") is WS and WS.kind == "gluon"
    assert list(WS.variants()) == [dict(INT8_D128, dtype=d, kv=kv, scales=sc) for d in spec.DTYPES
                                   for kv in spec.INT_FORMATS for sc in ("token", "channel", "group")]
    assert all(spec.PREFIX_PREFILL.launch_config(a, 90) is not None for a in WS.variants())  # same axes, both kernels
    keys = WS.keys(targets.get("sm90").spec_arch())
    assert len(keys) == 12 and {k.level for k in keys} == {ALIGNED}
    for name in ("sm80", "gfx942", "gfx90a"):  # wgmma and setmaxnreg: sm90 only
        assert WS.keys(targets.get(name).spec_arch()) == [], name
    assert WS.launch_config(INT8_D128, 100) is None  # nor sm100's tensor cores
    cfg = WS.launch_config(INT8_D128, 90)
    assert (cfg.num_warps, cfg.maxnreg) == (4, 0)  # the default partition; the binary says 16 warps
    assert WS.compile_constexprs(INT8_D128, 90) == {"BLOCK_D": 128, "BLOCK_M": 128, "BLOCK_N": 128, "KV_FORMAT": 3,
                                                    "SCALES": 1}
    assert WS.compile_constexprs(dict(INT8_D128, kv="int4", scales="group"), 90)["SCALES"] == 3
    # the op's grid depends on BLOCK_M: both kernels must agree on it
    assert spec.PREFIX_PREFILL.compile_constexprs(dict(INT8_D128, score="plain"), 90)["BLOCK_M"] == 128


@pytest.mark.parametrize("change,served", [
    ({}, True), ({"kv": "int4", "dtype": "fp16"}, True), ({"scales": "channel"}, True), ({"scales": "group"}, True),
    ({"block_d": 64}, False),
    ({"block_d": 256}, False), ({"kv": "same"}, False), ({"kv": "fp8_e4m3"}, False), ({"score": "mod"}, False),
])
def test_routing_rule(change, served):
    axes = dict(INT8_D128, **change)
    assert spec.ws_serves(axes, (9, 0), out_fp8=False, aligned=True) is served
    # never another GPU, fp8 output, or a call the ALIGNED binary cannot take
    for cap, fp8, aligned in (((8, 0), False, True), ((10, 0), False, True), ((9, 0), True, True),
                              ((9, 0), False, False)):
        assert not spec.ws_serves(axes, cap, out_fp8=fp8, aligned=aligned)


def test_cpu_calls_take_the_triton_kernel():
    # The interpreter runs @triton.jit kernels only: CPU tensors never route to the Gluon kernel.
    from tests.cpu.kernels.prefix_prefill.cases import make_case

    case, kw = make_case([40], [20], q_heads=4, kv_heads=2, head_dim=128, kv_format="int8", scales="token", seed=0)
    out = torch.empty_like(case["q"])
    axes, _grid, args = pp_op.launch_plan(case["q"], case["k"], case["v"], case["k_cache"], case["v_cache"],
                                          case["block_table"], case["query_start_loc"], case["seq_lens"], out,
                                          kw.get("kv_layout", "nhd"), kw["kv_format"], kw["k_scale"], kw["v_scale"],
                                          0.1, None, None, None, False)
    assert spec.ws_variant(axes)
    assert pp_op.kernel_for(axes, args) is spec.PREFIX_PREFILL


class _CudaPointer:
    """Stands in for a CUDA tensor where kernel_for reads one (is_cuda, get_device, data_ptr)."""
    is_cuda = True

    def __init__(self, address):
        self.address = address

    def data_ptr(self):
        return self.address

    def get_device(self):
        return 0


def _int8_d128_plan():
    from tests.cpu.kernels.prefix_prefill.cases import make_case

    case, kw = make_case([40], [20], q_heads=4, kv_heads=2, head_dim=128, kv_format="int8", scales="token", seed=0)
    out = torch.empty_like(case["q"])
    return pp_op.launch_plan(case["q"], case["k"], case["v"], case["k_cache"], case["v_cache"], case["block_table"],
                             case["query_start_loc"], case["seq_lens"], out, "nhd", "int8", kw["k_scale"],
                             kw["v_scale"], 0.1, None, None, None, False)


@pytest.mark.parametrize("built,capability,change,want", [
    ({"prefix_prefill_ws", "prefix_prefill"}, (9, 0), None, "prefix_prefill_ws"),
    ({"prefix_prefill"}, (9, 0), None, "prefix_prefill"),  # artifacts from before the Gluon kernel
    (set(), (9, 0), None, "prefix_prefill_ws"),  # nothing built: the JIT falls back to the faster one
    ({"prefix_prefill_ws", "prefix_prefill"}, (8, 0), None, "prefix_prefill"),
    ({"prefix_prefill_ws", "prefix_prefill"}, (10, 0), None, "prefix_prefill"),
    ({"prefix_prefill_ws", "prefix_prefill"}, (9, 0), "misaligned q", "prefix_prefill"),
    ({"prefix_prefill_ws", "prefix_prefill"}, (9, 0), "fp8 out", "prefix_prefill"),
    ({"prefix_prefill_ws", "prefix_prefill"}, (9, 0), "switched off", "prefix_prefill"),
])
def test_op_routing(built, capability, change, want, monkeypatch):
    from aotc.loader import dispatch
    from aotc.loader.targets import Device

    axes, _grid, args = _int8_d128_plan()
    args = [(_CudaPointer(4096 * (i + 1) + (2 if change == "misaligned q" and i == 0 else 0))
             if a.kind == "ptr" else v) for i, (a, v) in enumerate(zip(spec.KERNEL_ARGS, args))]
    if change == "fp8 out":
        args[spec.PREFIX_PREFILL.arg_index["out_fp8"]] = 1
    if change == "switched off":
        monkeypatch.setenv(pp_op.ENV_WS, "0")
    monkeypatch.setattr(dispatch, "device_of", lambda index: Device(name="NVIDIA GPU", capability=capability))
    monkeypatch.setattr(dispatch, "is_built", lambda kernel, axes_, device: kernel.name in built)
    assert pp_op.kernel_for(axes, args).name == want


def test_kernel_takes_the_triton_kernels_arguments():
    from triton.runtime.jit import JITFunction

    from aotc.kernels.prefix_prefill.kernel import prefix_prefill_kernel

    fn = jit_function(WS)  # refuses a spec whose kind is not the function's
    check_consistency(WS, fn)  # the build's own check: names, order, specialization switches
    triton_fn = prefix_prefill_kernel if hasattr(prefix_prefill_kernel, "params") else \
        JITFunction(prefix_prefill_kernel.fn, **prefix_prefill_kernel.kwargs)  # as built, not interpreted
    flags = [(p.name, p.do_not_specialize, p.do_not_specialize_on_alignment) for p in fn.params if not p.is_constexpr]
    triton_flags = [(p.name, p.do_not_specialize, p.do_not_specialize_on_alignment)
                    for p in triton_fn.params if not p.is_constexpr]
    # the Triton kernel's score/cache options come after the shared arguments (kernel_ws serves none)
    assert flags == triton_flags[:len(flags)]
    assert [f[0] for f in triton_flags[len(flags):]] == [a.name for a in spec.OPTION_ARGS]


_COMPILE = textwrap.dedent("""
    import json, re, sys
    from aotc.aot.triton_compat import compile_variant
    from aotc.kernels.prefix_prefill import spec
    c = compile_variant(spec.PREFIX_PREFILL_WS, spec.PREFIX_PREFILL_WS.keys(90)[int(sys.argv[1])], 90)
    import triton
    from triton.backends.compiler import GPUTarget
    print(json.dumps({"num_warps": c.metadata["num_warps"], "shared": c.metadata["shared"],
                      "global_scratch": c.metadata["global_scratch_size"], "symbol": c.symbol,
                      "e_machine": int.from_bytes(c.cubin[18:20], "little"), "sm": c.cubin[48] & 0xff}))
""")


@pytest.mark.parametrize("index", [0, 4, 11])
def test_sm90_binary(index):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _COMPILE, str(index)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    # two 4-warp consumers and an 8-warp producer: the launch needs 512 threads, as the manifest says
    assert got["num_warps"] == 16, got
    assert 190 * 1024 < got["shared"] <= 227 * 1024, got  # q twice + the 2-stage ring: one program an SM
    assert got["global_scratch"] == 0 and got["symbol"] == "prefix_prefill_ws_kernel"
    assert got["e_machine"] == 190 and got["sm"] == 90


REC = spec.PREFIX_PREFILL_WS_REC
REC_INT8 = dict(INT8_D128)  # the record kernel's axes: int8 per token at 128-wide tiles, nhd


def test_record_kernel_variants_keys_and_targets():
    assert get_spec("prefix_prefill_ws_rec") is REC and REC.kind == "gluon"
    assert list(REC.variants()) == [dict(REC_INT8, dtype=d, kv=kv, scales=sc) for d in spec.DTYPES
                                    for kv, sc in spec.REC_FORMATS]
    keys = REC.keys(targets.get("sm90").spec_arch())
    assert len(keys) == 6 and {k.level for k in keys} == {ALIGNED}
    for name in ("sm80", "gfx942", "gfx90a"):
        assert REC.keys(targets.get(name).spec_arch()) == [], name
    assert REC.launch_config(REC_INT8, 100) is None
    assert REC.compile_constexprs(dict(REC_INT8, kv="fp8_e4m3", scales="none"), 90) == {
        "BLOCK_D": 128, "BLOCK_M": 128, "BLOCK_N": 128, "KV_FORMAT": 1, "SCALES": 0}
    # the Triton kernel's BLOCK_M for the same calls (the op's grid): 128 too
    for kv, sc in spec.REC_FORMATS:
        axes = dict(REC_INT8, kv=kv, scales=sc, score="plain")
        assert spec.PREFIX_PREFILL.compile_constexprs(axes, 90)["BLOCK_M"] == 128
    # its binary assumes q's and out's alignment only: the caches' rows are vLLM's 4-byte-aligned record
    assert set(REC.divisible_args(ALIGNED)) == set(spec.REC_ALIGNED)
    check_consistency(REC, jit_function(REC))


@pytest.mark.parametrize("change,served", [
    ({}, True), ({"kv": "fp8_e4m3"}, True), ({"kv": "fp8_e4m3", "scales": "none"}, True), ({"dtype": "fp16"}, True),
    ({"kv_align": 4}, True), ({"block_d": 64}, False), ({"scales": "group"}, False), ({"kv": "int4"}, False),
    ({"kv": "fp8_e5m2", "scales": "none"}, False), ({"kv": "same", "scales": "none"}, False), ({"score": "mod"}, False),
    ({"layout": "vllm"}, False),
])
def test_record_kernel_routing_rule(change, served):
    axes = dict(REC_INT8, **change)
    assert spec.rec_serves(axes, (9, 0), out_fp8=False, aligned=True, from_cache=True, rows=True) is served
    for cap, fp8, aligned, from_cache, rows in (((8, 0), False, True, True, True), ((9, 0), True, True, True, True),
                                                 ((9, 0), False, False, True, True), ((9, 0), False, True, False, True),
                                                 ((9, 0), False, True, True, False)):
        assert not spec.rec_serves(axes, cap, out_fp8=fp8, aligned=aligned, from_cache=from_cache, rows=rows)


def _record_plan(fmt, head_dim=128, dtype=torch.bfloat16):
    from tests.cpu.aot.kv_align4_jit_sha import call
    from tests.cpu.aot.ws_rec_jit_sha import per_cache_call

    if fmt == "fp8_tensor":
        return per_cache_call(dtype)
    return call(head_dim, dtype, torch.int8 if fmt == "int8" else torch.float8_e4m3fn, fmt)


@pytest.mark.parametrize("fmt,change,want", [
    ("int8", None, "prefix_prefill_ws_rec"), ("fp8_e4m3", None, "prefix_prefill_ws_rec"),
    ("fp8_tensor", None, "prefix_prefill_ws_rec"),
    ("int8", "misaligned q", "prefix_prefill"),  # its ALIGNED binary's assumption
    ("int8", "cache 2 bytes off", "prefix_prefill"),  # its 4-byte loads of V
    ("int8", "K 4 bytes off", "prefix_prefill"),  # its 8-byte loads of K
    ("fp8_tensor", "K 4 bytes off", "prefix_prefill"),
    ("int8", "odd row stride", "prefix_prefill"),
    ("int8", "K row stride 4 bytes off 8", "prefix_prefill"),
    ("int8", "V row stride 4 bytes off 8", "prefix_prefill_ws_rec"),  # V's rows need 4 bytes only
    ("fp8_tensor", "V 8 bytes off", "prefix_prefill"),  # per cache: 16-byte loads of both
    ("int8", "V 8 bytes off", "prefix_prefill_ws_rec"),
    ("int8", "head dim 64", "prefix_prefill"),  # 64-wide tiles: kernel.py's
    ("int8", "fp8 out", "prefix_prefill"),
    ("fp8_e4m3", "switched off", "prefix_prefill"),
    ("int8", "not built", "prefix_prefill"),  # artifacts without it keep kernel.py's built binary
])
def test_record_kernel_op_routing(fmt, change, want, monkeypatch):
    from aotc.loader import dispatch
    from aotc.loader.targets import Device

    axes, _grid, args = _record_plan(fmt, 64 if change == "head dim 64" else 128)
    assert args[spec.PREFIX_PREFILL.arg_index["kv_from_cache"]] == 1
    args = [(_CudaPointer(4096 * (i + 1) + (2 if (change == "misaligned q" and i == 0)
                                            or (change == "cache 2 bytes off" and i == 4)
                                            else 4 if (change == "K 4 bytes off" and i == 3)
                                            else 8 if (change == "V 8 bytes off" and i == 4) else 0)
                          + (132 if i == 4 and fmt != "fp8_tensor" else 0)))  # the record's V: 4 bytes past 16
            if a.kind == "ptr" else v for i, (a, v) in enumerate(zip(spec.KERNEL_ARGS, args))]
    if change == "odd row stride":
        args[spec.PREFIX_PREFILL.arg_index["stride_kct"]] += 1  # int16 words: 2 bytes off a multiple of 4
    if change and change.endswith("row stride 4 bytes off 8"):  # int16 words: 264-byte rows -> 268
        args[spec.PREFIX_PREFILL.arg_index[f"stride_{change[0].lower()}ct"]] += 2
    if change == "fp8 out":
        args[spec.PREFIX_PREFILL.arg_index["out_fp8"]] = 1
    if change == "switched off":
        monkeypatch.setenv(pp_op.ENV_WS, "0")
    monkeypatch.setattr(dispatch, "device_of", lambda index: Device(name="NVIDIA GPU", capability=(9, 0)))
    monkeypatch.setattr(dispatch, "is_built", lambda kernel, axes_, device: change != "not built"
                        or kernel.name == "prefix_prefill")
    assert pp_op.kernel_for(axes, args).name == want


def test_record_kernel_sm90_binary():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = _COMPILE.replace("spec.PREFIX_PREFILL_WS", "spec.PREFIX_PREFILL_WS_REC")
    for index in (0, 5):
        res = subprocess.run([sys.executable, "-c", code, str(index)], env=env, capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        got = json.loads(res.stdout.strip().splitlines()[-1])
        assert got["num_warps"] == 16, got
        assert 128 * 1024 < got["shared"] <= 227 * 1024, got  # q (fp16) + the ring: one program an SM
        assert got["global_scratch"] == 0 and got["symbol"] == "prefix_prefill_ws_rec_kernel"
        assert got["e_machine"] == 190 and got["sm"] == 90
