"""decode's LSE, DecodePlan and int8 per-channel scales on a GPU, and the compat entry points:
against the float32 reference (cases.assert_close; lse within 2e-3 + 1e-3 |ref|), and the AOT
binaries' outputs against the JIT's bit for bit. Run after `aotc build --arch sm90` (the AOT runs
turn a JIT fallback into an error, so an unbuilt key fails loudly)."""
from types import SimpleNamespace

import pytest
import torch

from aotc import loader
from aotc.kernels.decode import reference as R
from aotc.loader.ops.decode import decode
from tests.cpu.kernels.decode.cases import assert_close, make_case
from tests.gpu.aot_jit import aot, jit_only  # noqa: F401 (jit_only: a fixture)

LENS = [0, 1, 63, 64, 65, 127, 128, 129, 4099, 16384]


def assert_lse(lse, ref, what=""):
    lse, ref = lse.cpu(), ref.cpu()
    empty = ref == float("-inf")
    assert not lse.isnan().any(), what
    assert torch.equal(lse == float("-inf"), empty), what
    err = (lse[~empty] - ref[~empty]).abs()
    assert (err <= 2e-3 + 1e-3 * ref[~empty].abs()).all(), f"{what}: lse error {err.max():.3g}"


CASES = {  # name: make_case keywords
    "bf16": dict(fmt="bf16"),
    "int8 token": dict(fmt="int8", quant_group=128),
    "int8 chunk": dict(fmt="int8", quant_group=64),
    "int4 token": dict(fmt="int4", quant_group=128),
    "int4 group": dict(fmt="int4", quant_group=32),
    "fp8_e4m3": dict(fmt="fp8_e4m3"),
    "int8 channel": dict(fmt="int8", scale_layout="channel"),
    "int8 channel head-major": dict(fmt="int8", scale_layout="channel", head_major=True, q_dtype=torch.float16),
}


def gpu_case(name, seed=0, **extra):
    return make_case(LENS, kv_heads=4, group=4, head_dim=128, page_size=16, extra_pages=5, device="cuda",
                     seed=seed, **{**CASES[name], **extra})


@pytest.mark.parametrize("name", list(CASES))
def test_lse_and_output_against_reference_and_jit(name, jit_only):
    case = gpu_case(name, seed=1)
    sinks = torch.randn(case.q.shape[1], device="cuda")

    def call():
        out = torch.full_like(case.q, float("nan"))
        lse = torch.full(case.q.shape[:2], float("nan"), device="cuda")
        return decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, out=out, return_lse=True,
                      lse=lse, window=5000, sinks=sinks, **case.kwargs)

    out, lse = aot(call)
    ref, ref_lse = case.reference(return_lse=True, window=5000, sinks=sinks)
    assert_close(out, ref, name)
    assert_lse(lse, ref_lse, name)
    jout, jlse = jit_only(call)
    assert torch.equal(out, jout) and torch.equal(lse, jlse), f"{name}: AOT != JIT"


@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
def test_channel_scales_every_head_dim_at_length(head_dim, jit_only):
    case = make_case([0, 1, 129, 8191, 16500], fmt="int8", scale_layout="channel", kv_heads=2, group=8,
                     head_dim=head_dim, page_size=32, device="cuda", seed=head_dim)
    call = lambda: decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens,  # noqa: E731
                          out=torch.full_like(case.q, float("nan")), **case.kwargs)
    out = aot(call)
    assert_close(out, case.reference(), f"channel d{head_dim}")
    assert torch.equal(out, jit_only(call)), f"channel d{head_dim}: AOT != JIT"


@pytest.mark.parametrize("name", ["bf16", "int8 token", "int4 group", "fp8_e4m3", "int8 channel head-major"])
def test_decode_plan_runs_layers_like_decode(name):
    layers = [gpu_case(name, seed=10 + i) for i in range(3)]
    first = layers[0]
    for c in layers[1:]:
        c.table, c.seq_lens = first.table, first.seq_lens
    ks, vs = first.kwargs.get("k_scale"), first.kwargs.get("v_scale")
    extra = {k: v for k, v in first.kwargs.items() if k in ("kv_format", "scale_layout")}
    plan = aot(lambda: loader.DecodePlan(first.table, first.seq_lens, q=first.q, k_cache=first.k_cache,
                                         v_cache=first.v_cache, k_scale=ks, v_scale=vs, return_lse=True, **extra))
    assert plan._bound is not None, "the plan did not take the prepared path"
    for c in layers:
        out = torch.full_like(c.q, float("nan"))
        lse = torch.full(c.q.shape[:2], float("nan"), device="cuda")
        aot(lambda: plan.run(c.q, c.k_cache, c.v_cache, out, c.kwargs.get("k_scale"), c.kwargs.get("v_scale"),
                             lse=lse))
        ref, ref_lse = c.reference(return_lse=True)
        assert_close(out, ref, f"plan {name}")
        assert_lse(lse, ref_lse, f"plan {name}")
        want, want_lse = decode(c.q, c.k_cache, c.v_cache, first.table, first.seq_lens, return_lse=True, **c.kwargs)
        assert torch.equal(out, want) and torch.equal(lse, want_lse), f"plan {name} != decode"


def test_decode_plan_misaligned_query_and_refusals():
    case = gpu_case("int8 token", seed=20)
    ks, vs = case.kwargs["k_scale"], case.kwargs["v_scale"]
    plan = loader.DecodePlan(case.table, case.seq_lens, q=case.q, k_cache=case.k_cache, v_cache=case.v_cache,
                             k_scale=ks, v_scale=vs)
    buf = torch.empty(case.q.numel() + 1, dtype=case.q.dtype, device="cuda")
    q_mis = buf[1:].view_as(case.q)  # 2 bytes off 16-byte alignment: the generic binary
    q_mis.copy_(case.q)
    out = torch.full_like(case.q, float("nan"))
    aot(lambda: plan.run(q_mis, case.k_cache, case.v_cache, out, ks, vs))
    assert_close(out, case.reference(), "plan misaligned q")
    poisoned = torch.full_like(case.q, float("nan"))
    with pytest.raises(ValueError, match="k_cache"):
        plan.run(case.q, case.k_cache[:-1], case.v_cache, poisoned, ks, vs)
    with pytest.raises(ValueError, match="q: .*device cpu"):
        plan.run(case.q.cpu(), case.k_cache, case.v_cache, poisoned, ks, vs)
    with pytest.raises(ValueError, match="k_cache: an int8 cache is read two bytes"):
        odd = torch.empty(case.k_cache.numel() + 1, dtype=torch.int8, device="cuda")[1:].view(case.k_cache.shape)
        plan.run(case.q, odd, case.v_cache, poisoned, ks, vs)
    torch.cuda.synchronize()
    assert poisoned.isnan().all()


def test_decode_plan_in_a_cuda_graph():
    """Capture plan.run for two layers; new queries and cache contents replay correctly."""
    layers = [gpu_case("int4 group", seed=30 + i) for i in range(2)]
    first = layers[0]
    layers[1].table, layers[1].seq_lens = first.table, first.seq_lens
    plan = loader.DecodePlan(first.table, first.seq_lens, q=first.q, k_cache=first.k_cache, v_cache=first.v_cache,
                             k_scale=first.kwargs["k_scale"], v_scale=first.kwargs["v_scale"], return_lse=True)
    outs = [torch.empty_like(c.q) for c in layers]
    lses = [torch.empty(c.q.shape[:2], device="cuda") for c in layers]

    def step():
        for c, o, l in zip(layers, outs, lses):
            plan.run(c.q, c.k_cache, c.v_cache, o, c.kwargs["k_scale"], c.kwargs["v_scale"], lse=l)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for c in layers:
        c.q.copy_(torch.randn_like(c.q))
        c.v_cache.copy_(c.v_cache.flip(0))  # pages reversed, with their per-token scales
        c.kwargs["v_scale"].copy_(c.kwargs["v_scale"].flip(0))
        c.v_real = c.v_real.flip(0)
    for o in outs:
        o.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    for c, o, l in zip(layers, outs, lses):
        ref, ref_lse = c.reference(return_lse=True)
        assert_close(o, ref, "graph replay")
        assert_lse(l, ref_lse, "graph replay")


def test_vllm_entry_point_on_gpu():
    from aotc.compat import vllm

    case = make_case(LENS, fmt="bf16", kv_heads=4, group=4, head_dim=128, page_size=16, device="cuda", seed=40)
    o = torch.full_like(case.q, float("nan"))
    lse = torch.full(case.q.shape[:2], float("nan"), device="cuda")
    logits = torch.empty(len(LENS), 16, 8, 129, device="cuda")
    aot(lambda: vllm.decode_attention_fwd(case.q, case.k_cache, case.v_cache, o, lse, case.table.long(),
                                          case.seq_lens, logits, 8, 0.09, 16))
    ref, ref_lse = case.reference(return_lse=True, sm_scale=0.09)
    assert_close(o, ref, "vllm")
    assert_lse(lse, ref_lse, "vllm")


@pytest.mark.parametrize("fmt,group", [("int4", 8), ("int8", 64)])
def test_lightllm_entry_point_on_gpu(fmt, group):
    from aotc.compat import lightllm
    from tests.cpu.compat.test_lightllm import lightllm_quantize, lightllm_dequantize

    g = torch.Generator(device="cuda").manual_seed(50)
    kvh, hd, lens = 4, 128, [1, 129, 9000]
    size = sum(lens) + 10
    new = (torch.randn(size, 2 * kvh, hd, device="cuda", generator=g) * 2).to(torch.bfloat16)
    kv_buffer, scale_buffer = lightllm_quantize(new, fmt, group)
    real = lightllm_dequantize(kv_buffer, scale_buffer, fmt)
    req_to_token = torch.randint(0, size, (3, 9000), device="cuda", generator=g, dtype=torch.int32)
    state = SimpleNamespace(batch_size=3, b_req_idx=torch.tensor([2, 0, 1], dtype=torch.int32, device="cuda"),
                            b_seq_len=torch.tensor(lens, dtype=torch.int32, device="cuda"),
                            req_manager=SimpleNamespace(req_to_token_indexs=req_to_token))
    q = torch.randn(3, 16, hd, device="cuda", generator=g).to(torch.bfloat16)
    out = aot(lambda: lightllm.token_decode_attention_flash_decoding(
        q, state, kv_buffer[:, :kvh], scale_buffer[:, :kvh], kv_buffer[:, kvh:], scale_buffer[:, kvh:]))
    ref = R.decode_reference(q, real[:, :kvh].unsqueeze(1), real[:, kvh:].unsqueeze(1), req_to_token,
                             state.b_seq_len, req_idx=state.b_req_idx)
    assert_close(out, ref, f"lightllm {fmt}")
