"""The warp-specialized Gluon state pass (chunk_state_ws.py): its variant table, the rule that routes
the op's state pass to it, its agreement with the Triton state pass's parameters, and what its sm90
binaries contain (compiled in a subprocess on this CPU). Its numerics run on the GPU only (Gluon has
no interpreter): tests/gpu/test_gated_delta_prefill.py."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from aotc.aot.triton_compat import check_consistency, jit_function
from aotc.kernels.gated_delta import chunk_spec
from aotc.kernels.gated_delta import state_ws_spec as ws_spec
from aotc.kernels.registry import get_spec
from aotc.kernels.variants import ALIGNED
from aotc.loader import targets
from aotc.loader.ops import gated_delta_prefill as op

WS = ws_spec.GDN_CHUNK_STATE_WS
BF16_128 = {"dtype": "bf16", "head_k": 128, "head_v": 128, "bv": 32}


def test_variants_keys_and_targets():
    assert get_spec("gdn_chunk_state_ws") is WS and WS.kind == "gluon"
    # 16-bit x (tile 64: bv 32, 64; tile 128: bv 32, 128): the Triton state pass's axes at those tiles
    assert list(WS.variants()) == [a for a in chunk_spec.state_variants()
                                   if a["dtype"] != "fp32" and a["head_k"] <= 128]
    assert len(list(WS.variants())) == 8
    keys = WS.keys(targets.get("sm90").spec_arch())
    assert len(keys) == 8 and {k.level for k in keys} == {ALIGNED}
    for name in ("sm80", "gfx942", "gfx90a"):  # wgmma and setmaxnreg: sm90 only
        assert WS.keys(targets.get(name).spec_arch()) == [], name
    assert WS.launch_config(BF16_128, 100) is None  # nor sm100's tensor cores
    assert (WS.launch_config(BF16_128, 90).num_warps, WS.launch_config(BF16_128, 90).maxnreg) == (4, 0)
    assert WS.compile_constexprs(BF16_128, 90) == {"HEAD_K": 128, "HEAD_V": 128, "BV": 32, "NC": 1}
    assert WS.compile_constexprs(dict(BF16_128, bv=128), 90)["NC"] == 2
    assert WS.compile_constexprs(dict(BF16_128, head_k=64, head_v=64, bv=64), 90)["NC"] == 1


@pytest.mark.parametrize("change,served", [
    ({}, True), ({"bv": 128}, True), ({"dtype": "fp16"}, True), ({"head_k": 64, "head_v": 64, "bv": 64}, True),
    ({"dtype": "fp32"}, False), ({"head_k": 256, "head_v": 256}, False), ({"head_k": 64}, False),
    ({"bv": 64}, False),  # not a tile the op picks at 128
])
def test_routing_rule(change, served):
    axes = dict(BF16_128, **change)
    assert ws_spec.ws_serves(axes, (9, 0), aligned=True) is served
    for cap, aligned in (((8, 0), True), ((10, 0), True), ((9, 0), False)):
        assert not ws_spec.ws_serves(axes, cap, aligned=aligned)


class _CudaTensor:
    """Stands in for the CUDA workspace aligned_state_spec reads (is_cuda, get_device)."""
    is_cuda = True

    def get_device(self):
        return 0


@pytest.mark.parametrize("built,capability,change,want", [
    ({"gdn_chunk_state_ws", "gdn_chunk_state"}, (9, 0), None, "gdn_chunk_state_ws"),
    ({"gdn_chunk_state"}, (9, 0), None, "gdn_chunk_state"),  # artifacts from before the Gluon kernel
    (set(), (9, 0), None, "gdn_chunk_state_ws"),  # nothing built: the JIT falls back to the faster one
    ({"gdn_chunk_state_ws", "gdn_chunk_state"}, (8, 0), None, "gdn_chunk_state"),
    ({"gdn_chunk_state_ws", "gdn_chunk_state"}, (10, 0), None, "gdn_chunk_state"),
    ({"gdn_chunk_state_ws", "gdn_chunk_state"}, (9, 0), "fp32", "gdn_chunk_state"),
    ({"gdn_chunk_state_ws", "gdn_chunk_state"}, (9, 0), "switched off", "gdn_chunk_state"),
])
def test_op_routing(built, capability, change, want, monkeypatch):
    from aotc.loader import dispatch
    from aotc.loader.targets import Device

    axes = dict(BF16_128, dtype="fp32") if change == "fp32" else dict(BF16_128)
    if change == "switched off":
        monkeypatch.setenv(ws_spec.ENV_WS, "0")
    monkeypatch.setattr(dispatch, "device_of", lambda index: Device(name="NVIDIA GPU", capability=capability))
    monkeypatch.setattr(dispatch, "is_built", lambda kernel, axes_, device: kernel.name in built)
    assert op.aligned_state_spec(axes, _CudaTensor()).name == want


def test_cpu_calls_take_the_triton_kernel():
    # The interpreter runs @triton.jit kernels only: CPU tensors never route to the Gluon kernel.
    from tests.cpu.kernels.gated_delta.chunk_cases import make_case

    c = make_case([65, 3], H=1, HV=2, K=128, V=128, seed=0)
    out = torch.empty(c["v"].shape, dtype=c["q"].dtype)
    _prep, st = op.launch_plan(c["q"], c["k"], c["v"], c["g"], c["beta"], c["state"], c["state_indices"],
                               c["cu_seqlens"], out, 128 ** -0.5, True, "vmajor")
    assert ws_spec.ws_variant(st[1]) and st[0] is chunk_spec.GDN_CHUNK_STATE


def test_kernel_takes_the_triton_kernels_arguments():
    from triton.runtime.jit import JITFunction

    from aotc.kernels.gated_delta.chunk import gdn_chunk_state

    fn = jit_function(WS)  # refuses a spec whose kind is not the function's
    check_consistency(WS, fn)  # the build's own check: names, order, specialization switches
    triton_fn = gdn_chunk_state if hasattr(gdn_chunk_state, "params") else \
        JITFunction(gdn_chunk_state.fn, **gdn_chunk_state.kwargs)  # as built, not interpreted
    flags = [(p.name, p.do_not_specialize, p.do_not_specialize_on_alignment) for p in fn.params if not p.is_constexpr]
    assert flags == [(p.name, p.do_not_specialize, p.do_not_specialize_on_alignment)
                     for p in triton_fn.params if not p.is_constexpr]


_COMPILE = textwrap.dedent("""
    import json, sys
    from aotc.aot.triton_compat import compile_variant
    from aotc.kernels.gated_delta import state_ws_spec as s
    key = [k for k in s.GDN_CHUNK_STATE_WS.keys(90) if k.axis_dict == json.loads(sys.argv[1])][0]
    c = compile_variant(s.GDN_CHUNK_STATE_WS, key, 90)
    print(json.dumps({"num_warps": c.metadata["num_warps"], "shared": c.metadata["shared"],
                      "global_scratch": c.metadata["global_scratch_size"], "symbol": c.symbol,
                      "e_machine": int.from_bytes(c.cubin[18:20], "little"), "sm": c.cubin[48] & 0xff}))
""")


@pytest.mark.parametrize("axes,warps", [(BF16_128, 8), (dict(BF16_128, bv=128), 16),
                                        (dict(BF16_128, dtype="fp16", head_k=64, head_v=64, bv=64), 8)])
def test_sm90_binary(axes, warps):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps(axes)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    # the consumers (one warpgroup each) and the producer (4 warps; 8 beside two consumers): a power of two
    assert got["num_warps"] == warps, got
    assert got["shared"] <= 227 * 1024, got  # the ring: one program an SM at K = 128
    assert got["global_scratch"] == 0 and got["symbol"] == "gdn_chunk_state_ws"
    assert got["e_machine"] == 190 and got["sm"] == 90


def test_build_hashes_the_gluon_source():
    from aotc.aot.sources import named_sources

    # an edit to the kernel rebuilds its binaries (it imports nothing else of aotc)
    assert [name for name, _ in named_sources(WS)] == ["gated_delta/chunk_state_ws.py"]
