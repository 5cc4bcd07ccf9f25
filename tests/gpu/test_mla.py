"""The MLA family (loader.mla_decode, and decode with unequal head sizes) on a GPU: against the
float32 reference (tests/cpu/kernels/mla/cases.assert_close: bf16 2e-2 abs + rel, fp16 5e-3;
lse within 2e-3 + 1e-3 |ref|), outputs poisoned with NaN first, and the AOT binaries' outputs
against the JIT's bit for bit. Run after `aotc build --arch sm90` (the AOT runs turn a JIT
fallback into an error, so an unbuilt key fails loudly)."""

import pytest
import torch

from aotc import loader
from tests.cpu.kernels.mla.cases import assert_close, assert_lse_close, make_case
from tests.gpu.aot_jit import aot, jit_only  # noqa: F401 (jit_only: a fixture)

LENS = [0, 1, 63, 64, 65, 127, 128, 129, 4099, 16384]


def _nan(batch, heads, d_v, dtype):
    return (torch.full((batch, heads, d_v), float("nan"), dtype=dtype, device="cuda"),
            torch.full((batch, heads), float("nan"), device="cuda"))


def against_reference_and_jit(case, call, jit, what):
    """call() on the built binaries against the float32 reference (out and lse), then through the
    JIT: the same bits."""
    out, lse = aot(call)
    ref, ref_lse = case.reference(return_lse=True)
    assert_close(out, ref, what)
    assert_lse_close(lse, ref_lse)
    jout, jlse = jit(call)
    assert torch.equal(out, jout) and torch.equal(lse, jlse), "AOT != JIT"


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8_e4m3"])
@pytest.mark.parametrize("group,page_size", [(16, 64), (128, 16), (32, 1), (20, 128)])
def test_latent_against_reference_and_jit(fmt, group, page_size, jit_only):
    case = make_case(LENS, fmt=fmt, group=group, page_size=page_size, device="cuda", seed=group + page_size)
    if fmt == "fp8_e4m3":
        case.q = case.q.to(torch.bfloat16)

    def call():
        out, lse = _nan(len(LENS), group, 512, case.q.dtype)
        return loader.mla_decode(case.q, case.k_cache, case.table, case.seq_lens, v_head_dim=512, out=out,
                                 lse=lse, return_lse=True, **case.kwargs)

    against_reference_and_jit(case, call, jit_only, f"latent {fmt} group {group} page {page_size}")


@pytest.mark.parametrize("num_splits", [None, 512])  # the rule's (128 at batch 1 on an H100), and the most
@pytest.mark.parametrize("length", [1, 65, 4099, 32768])
def test_batch_one_many_splits_against_reference_and_jit(length, num_splits, jit_only):
    """Batch 1 at 16 heads: past 64 splits, the one-tile merge of 65-256 splits (the rule's count)
    and the looping merge (512) over mostly empty splits at short
    lengths; outputs poisoned, AOT == JIT bit for bit."""
    case = make_case([length], group=16, page_size=64, device="cuda", seed=length)

    def call():
        out, lse = _nan(1, 16, 512, case.q.dtype)
        return loader.mla_decode(case.q, case.k_cache, case.table, case.seq_lens, out=out, lse=lse,
                                 return_lse=True, num_splits=num_splits)

    against_reference_and_jit(case, call, jit_only, f"batch 1 x {length}, {num_splits} splits")


@pytest.mark.parametrize("d_qk,d_v,fmt", [(576, 512, "bf16"), (192, 128, "bf16"), (128, 512, "fp8_e4m3"),
                                          (576, 128, "bf16"), (192, 512, "fp16")])
def test_separate_caches_through_decode(d_qk, d_v, fmt, jit_only):
    case = make_case(LENS, d_qk=d_qk, d_v=d_v, latent=False, fmt=fmt, kv_heads=4, group=8, page_size=16,
                     device="cuda", seed=d_qk + d_v)
    if fmt == "fp8_e4m3":
        case.q = case.q.to(torch.bfloat16)

    def call():
        out, lse = _nan(len(LENS), 32, d_v, case.q.dtype)
        return loader.decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, out=out, lse=lse,
                             return_lse=True, **case.kwargs)

    against_reference_and_jit(case, call, jit_only, f"separate {d_qk}/{d_v} {fmt}")


def test_cuda_graph_replays_at_new_lengths():
    case = make_case([4099, 70, 1], group=16, page_size=64, device="cuda", seed=9)
    out = torch.empty(3, 16, 512, dtype=case.q.dtype, device="cuda")
    lens = case.seq_lens.clone()
    aot(lambda: loader.mla_decode(case.q, case.k_cache, case.table, lens, out=out, validate=False))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loader.mla_decode(case.q, case.k_cache, case.table, lens, out=out, validate=False)
    for new in ([10, 4099, 0], [1, 2, 3000]):
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        case.seq_lens = lens
        assert_close(out, case.reference(), f"graph replay at {new}")


def test_plan_runs_layers_bit_for_bit_as_mla_decode():
    layers = [make_case(LENS, group=128, page_size=64, device="cuda", seed=50 + i) for i in range(2)]
    first = layers[0]
    plan = aot(lambda: loader.MLADecodePlan(first.table, first.seq_lens, q=first.q, kv_cache=first.k_cache,
                                            return_lse=True))
    for c in layers:
        c.table, c.seq_lens = first.table, first.seq_lens
        out = torch.full((len(LENS), 128, 512), float("nan"), dtype=c.q.dtype, device="cuda")
        got, lse = aot(lambda: plan.run(c.q, c.k_cache, out))
        want, want_lse = aot(lambda: loader.mla_decode(c.q, c.k_cache, c.table, c.seq_lens, return_lse=True))
        assert torch.equal(got, want) and torch.equal(lse, want_lse)
