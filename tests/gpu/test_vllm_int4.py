"""decode and prefix_prefill over vLLM 0.33's INT4_PER_TOKEN_HEAD cache on a GPU (kv_format
"int4_rht"; compat.vllm's unified_attention): against the float32 references over the dequantized,
unrotated cache (decode at batch 32 and lengths around tiles up to 4K + 1; a mixed prefill batch
with contexts up to 4K), written by aotc's writers (kernels/common/int4_rht.py, and
compat.vllm.reshape_and_cache_int4), AOT == JIT bit for bit (decode's two tiles, prefill), decode's
DecodePlan, eager steady state and CUDA graph bit-equal to a checked call (the rotation's signs on
every launch path), and,
when vLLM's files are at hand (AOTC_VLLM_PEER: its sdist
or an extracted folder; skipped otherwise), against vLLM's own writer and reader on the same
buffers. Tolerance: 2e-2 absolute and relative (bf16/fp16 output, as the CPU tests), 3e-2 for vLLM's
reader; outputs NaN first."""
import os
import tempfile

import pytest
import torch

from aotc import loader
from aotc.compat import vllm as compat
from aotc.kernels.common import int4_rht as F
from aotc.kernels.decode import reference as R
from aotc.kernels.prefix_prefill.reference import prefix_prefill_ref
from tests.cpu.kernels.decode.test_vllm_int4 import int4_cache
from tests.gpu.aot_jit import aot, jit_only  # noqa: F401 - the fixture

DEV = "cuda"
LENS = [1, 63, 64, 65, 4097, 100, 2048, 3000] * 4  # batch 32
TOL = dict(atol=2e-2, rtol=2e-2)


def _problem(head_dim, dtype, lens=LENS, seed=0, kv_heads=8, group=4, page=16):
    g = torch.Generator(device=DEV).manual_seed(seed)
    pages_per = -(-max(lens) // page)
    pages = len(lens) * pages_per + 1
    table = torch.randperm(pages, generator=g, device=DEV)[: len(lens) * pages_per].view(len(lens), pages_per)
    k = torch.randn(pages, page, kv_heads, head_dim, generator=g, device=DEV).to(dtype)
    v = torch.randn(pages, page, kv_heads, head_dim, generator=g, device=DEV).to(dtype)
    q = torch.randn(len(lens), kv_heads * group, head_dim, generator=g, device=DEV).to(dtype)
    return q, k, v, table.to(torch.int32), torch.tensor(lens, dtype=torch.int32, device=DEV)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("inline", [False, True], ids=["separate", "inline"])
def test_reference_at_length(dtype, head_dim, inline):
    q, k, v, table, lens = _problem(head_dim, dtype, seed=head_dim)
    kc, vc, ks, vs, k_real, v_real = int4_cache(k, v, inline)
    want, want_lse = R.decode_reference(q, k_real, v_real, table, lens, return_lse=True)
    out = torch.full_like(q, float("nan"))
    _, lse = aot(lambda: loader.decode(q, kc, vc, table, lens, k_scale=ks, v_scale=vs, kv_format="int4_rht",
                                       out=out, return_lse=True))
    torch.testing.assert_close(out.float(), want, **TOL)
    torch.testing.assert_close(lse, want_lse, atol=2e-2, rtol=1e-3)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("lens", [LENS, [5000]], ids=["batch32", "batch1"])  # the narrow and the wide tile
def test_aot_equals_jit(head_dim, lens, jit_only):  # noqa: F811
    q, k, v, table, seq_lens = _problem(head_dim, torch.bfloat16, lens=lens, seed=7)
    kc, vc, ks, vs, _, _ = int4_cache(k, v)

    def run():
        out = torch.full_like(q, float("nan"))
        return loader.decode(q, kc, vc, table, seq_lens, k_scale=ks, v_scale=vs, kv_format="int4_rht", out=out)

    assert torch.equal(aot(run), jit_only(run))


@pytest.mark.parametrize("head_dim", [64, 128])
def test_plan_steady_state_and_graph_equal_the_call(head_dim):
    """The rotation's signs reach every launch path: DecodePlan's packed launch, an unvalidated
    eager call's steady state and a CUDA graph of it, each bit-equal to a validated call."""
    q, k, v, table, lens = _problem(head_dim, torch.bfloat16, seed=21)
    kc, vc, ks, vs, _, _ = int4_cache(k, v, inline=True)
    kw = dict(k_scale=ks, v_scale=vs, kv_format="int4_rht")
    want = aot(lambda: loader.decode(q, kc, vc, table, lens, **kw))
    out = torch.full_like(q, float("nan"))
    for _ in range(3):  # the later calls take the steady state
        out.fill_(float("nan"))
        aot(lambda: loader.decode(q, kc, vc, table, lens, out=out, validate=False, **kw))
        assert torch.equal(out, want)
    plan = loader.DecodePlan(table, lens, q=q, k_cache=kc, v_cache=vc, **kw)
    out.fill_(float("nan"))
    aot(lambda: plan.run(q, kc, vc, out, ks, vs))
    assert torch.equal(out, want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loader.decode(q, kc, vc, table, lens, out=out, validate=False, **kw)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


@pytest.fixture(scope="module")
def vllm_ops():
    peer = os.environ.get("AOTC_VLLM_PEER")
    if not peer:
        pytest.skip("AOTC_VLLM_PEER (vLLM 0.33.0's sdist or files) not set")
    import sys

    from tests.gpu.conformance import vllm_runner

    work = tempfile.mkdtemp(prefix="aotc-vllm-int4-")
    root = vllm_runner.locate_peer(peer, os.path.join(work, "peer"))
    sys.path.insert(0, vllm_runner.build_sandbox(root, "vllm", os.path.join(work, "vllm")))
    from vllm.v1.attention.ops import int4_per_token_head, triton_unified_attention

    return int4_per_token_head, triton_unified_attention


@pytest.mark.parametrize("head_dim", [64, 128])
def test_same_buffers_as_vllm(head_dim, vllm_ops):
    """vLLM's writer fills the cache; vLLM's unified_attention and aotc's read it; both match the
    reference over aotc's dequantization of vLLM's bytes (the format read the same way)."""
    int4_mod, ua = vllm_ops
    q, k, v, table, lens = _problem(head_dim, torch.bfloat16, seed=11)
    pages, page, kv_heads, _ = k.shape
    kc = torch.zeros(pages, page, kv_heads, head_dim // 2, dtype=torch.uint8, device=DEV)
    vc = torch.zeros_like(kc)
    ks = torch.zeros(pages, page, kv_heads, device=DEV)
    vs = torch.zeros_like(ks)
    slots = torch.arange(pages * page, device=DEV)
    int4_mod.reshape_and_cache_int4(k.flatten(0, 1), v.flatten(0, 1), kc, vc, slots, k_scale_cache=ks,
                                    v_scale_cache=vs)
    # aotc's writer stores the same format: codes within one step (vLLM rounds the rotation in bf16 first)
    kp, kw = F.write(k)
    assert float((F.unpack_nibbles(kp).float() - F.unpack_nibbles(kc).float()).abs().gt(1).float().mean()) < 1e-3
    want = R.decode_reference(q, F.dequantize(kc, ks), F.dequantize(vc, vs), table, lens)
    b = q.shape[0]
    args = dict(cu_seqlens_q=torch.arange(b + 1, dtype=torch.int32, device=DEV), max_seqlen_q=1, seqused_k=lens,
                max_seqlen_k=int(lens.max()), softmax_scale=head_dim ** -0.5, causal=True, window_size=(-1, -1),
                block_table=table, softcap=0, q_descale=None, k_descale=None, v_descale=None,
                kv_quant_mode=compat.KVQuantMode.INT4_PER_TOKEN_HEAD, k_scale_cache=ks, v_scale_cache=vs)
    ours, theirs = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    aot(lambda: compat.unified_attention(q, kc, vc, ours, **args))
    ua.unified_attention(q, kc, vc, theirs, **{**args, "kv_quant_mode": ua.KVQuantMode.INT4_PER_TOKEN_HEAD})
    torch.cuda.synchronize()
    torch.testing.assert_close(ours.float(), want, **TOL)
    torch.testing.assert_close(theirs.float(), want, atol=3e-2, rtol=3e-2)


def _mixed(head_dim, seed=0, q_lens=(300, 1, 129, 64, 1), ctx=(1000, 4097, 0, 200, 63), kv_heads=4, heads=16, bs=16):
    """unified_attention's arguments over a cache filled by compat.vllm.reshape_and_cache_int4, and
    the real values it holds."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    full = [c + n for c, n in zip(ctx, q_lens)]
    pages = [-(-n // bs) for n in full]
    nb = sum(pages) + 3
    order = torch.randperm(nb, generator=g, device=DEV)
    table = torch.zeros(len(full), max(pages), dtype=torch.int32, device=DEV)
    i = 0
    for b, n in enumerate(pages):
        table[b, :n] = order[i:i + n].to(torch.int32)
        i += n
    kc = torch.zeros(nb, bs, kv_heads, head_dim // 2, dtype=torch.uint8, device=DEV)
    vc = torch.zeros_like(kc)
    ks = torch.zeros(nb, bs, kv_heads, device=DEV)
    vs = torch.zeros_like(ks)
    slots = torch.cat([table[b, torch.arange(n, device=DEV) // bs].long() * bs + torch.arange(n, device=DEV) % bs
                       for b, n in enumerate(full)])
    key = torch.randn(len(slots), kv_heads, head_dim, generator=g, device=DEV).bfloat16()
    value = torch.randn(len(slots), kv_heads, head_dim, generator=g, device=DEV).bfloat16()
    compat.reshape_and_cache_int4(key, value, kc, vc, slots, k_scale_cache=ks, v_scale_cache=vs)
    q = torch.randn(sum(q_lens), heads, head_dim, generator=g, device=DEV).bfloat16()
    qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    lens = torch.tensor(full, dtype=torch.int32, device=DEV)
    args = dict(cu_seqlens_q=qsl, max_seqlen_q=max(q_lens), seqused_k=lens, max_seqlen_k=max(full),
                softmax_scale=head_dim ** -0.5, causal=True, window_size=(-1, -1), block_table=table, softcap=0,
                q_descale=None, k_descale=None, v_descale=None, kv_quant_mode=compat.KVQuantMode.INT4_PER_TOKEN_HEAD,
                k_scale_cache=ks, v_scale_cache=vs)
    return q, kc, vc, args, F.dequantize(kc, ks), F.dequantize(vc, vs)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_prefill_rows_reference(head_dim):
    q, kc, vc, args, k_real, v_real = _mixed(head_dim, seed=head_dim)
    out = torch.full_like(q, float("nan"))
    aot(lambda: compat.unified_attention(q, kc, vc, out, **args))
    want = prefix_prefill_ref(q, None, None, k_real, v_real, args["block_table"], args["cu_seqlens_q"],
                              args["seqused_k"], sm_scale=head_dim ** -0.5)
    torch.testing.assert_close(out.float(), want.float(), **TOL)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_prefill_rows_aot_equals_jit(head_dim, jit_only):  # noqa: F811
    q, kc, vc, args, _, _ = _mixed(head_dim, seed=3, q_lens=(70, 1, 33), ctx=(500, 90, 0))

    def run():
        out = torch.full_like(q, float("nan"))
        compat.unified_attention(q, kc, vc, out, **args)
        return out

    assert torch.equal(aot(run), jit_only(run))


@pytest.mark.parametrize("head_dim", [64, 128])
def test_prefill_rows_as_vllm(head_dim, vllm_ops):
    """vLLM's unified_attention and aotc's on the same mixed batch (aotc's writer), against the reference."""
    _, ua = vllm_ops
    q, kc, vc, args, k_real, v_real = _mixed(head_dim, seed=5)
    ours, theirs = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    aot(lambda: compat.unified_attention(q, kc, vc, ours, **args))
    ua.unified_attention(q, kc, vc, theirs, **{**args, "kv_quant_mode": ua.KVQuantMode.INT4_PER_TOKEN_HEAD})
    torch.cuda.synchronize()
    want = prefix_prefill_ref(q, None, None, k_real, v_real, args["block_table"], args["cu_seqlens_q"],
                              args["seqused_k"], sm_scale=head_dim ** -0.5)
    torch.testing.assert_close(ours.float(), want.float(), **TOL)
    torch.testing.assert_close(theirs.float(), want.float(), atol=3e-2, rtol=3e-2)
