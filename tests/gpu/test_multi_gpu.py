"""Several GPUs in one process: decode on a GPU other than torch's current one (launched in that
device's context), on each GPU in turn and from one thread per GPU at once, and a CUDA graph
captured on the second GPU. Skipped with fewer than two GPUs."""
import threading

import pytest
import torch

from aotc.loader import dispatch
from aotc.loader.ops.decode import decode
from tests.cpu.kernels.decode.cases import assert_close, make_case

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")

LENS = [0, 1, 127, 128, 129, 3000]


def case_on(device, fmt, seed):
    return make_case(LENS, fmt=fmt, kv_heads=2, group=4, head_dim=128, page_size=16, quant_group=32,
                     device=device, seed=seed)


def run(case, **kw):
    out = torch.full_like(case.q, float("nan"))
    decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, out=out, **case.kwargs, **kw)
    return out


@pytest.mark.parametrize("fmt", ["bf16", "int4"])
def test_tensors_on_a_gpu_that_is_not_current(fmt):
    dispatch.reset()
    torch.cuda.set_device(0)
    case = case_on("cuda:1", fmt, seed=1)
    out = run(case)
    torch.cuda.synchronize(1)
    assert out.device == torch.device("cuda:1")
    assert_close(out, case.reference(), f"{fmt} on cuda:1 with cuda:0 current")


def test_each_gpu_in_turn_loads_its_own_binaries():
    dispatch.reset()
    cases = [case_on(f"cuda:{d}", "int8", seed=10 + d) for d in (0, 1)]
    for _ in range(3):
        for d, case in enumerate(cases):
            with torch.cuda.device(d):  # the current device matches: the prepared path
                out = run(case)
            torch.cuda.synchronize(d)
            assert_close(out, case.reference(), f"int8 on cuda:{d}")
    devices = {key[2] for key in dispatch._selections}
    assert devices == {0, 1}


def test_one_thread_per_gpu_at_once():
    dispatch.reset()
    cases = [case_on(f"cuda:{d}", "bf16", seed=20 + d) for d in (0, 1)]
    errors = []

    def work(d):
        try:
            torch.cuda.set_device(d)
            for _ in range(20):
                out = run(cases[d], validate=False)
            torch.cuda.synchronize(d)
            assert_close(out, cases[d].reference(), f"bf16 thread on cuda:{d}")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((d, e))

    threads = [threading.Thread(target=work, args=(d,)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_graph_captured_on_the_second_gpu_replays_new_lengths():
    dispatch.reset()
    case = case_on("cuda:1", "bf16", seed=30)
    with torch.cuda.device(1):
        out = torch.full_like(case.q, float("nan"))
        step = lambda: decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, out=out,  # noqa: E731
                              **case.kwargs)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            step()  # warm up (loads) off the capture
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        case.seq_lens.copy_(torch.tensor([5, 0, 128, 1, 2999, 64], dtype=torch.int32, device="cuda:1"))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize(1)
    assert_close(out, case.reference(), "graph replay on cuda:1")
