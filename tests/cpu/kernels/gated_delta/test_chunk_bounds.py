"""The chunked prefill's masked tiles touch only their tensors (interpreter, kernels/bounds.py): the
head sizes whose GPU binaries faulted or computed wrong on the H100 (fp32 at the 256 tile, aligned
and off it; KDA at 16-bit with K off the 16 grid) and a padded and an empty sequence. The check
itself is shown to catch a read one element past a tensor."""
import pytest
import torch
import triton
import triton.language as tl

from aotc.loader.ops.gated_delta_prefill import gated_delta_prefill
from tests.cpu.kernels.bounds import addresses_checked

from .chunk_cases import assert_close, make_case


@pytest.mark.parametrize("K,kda,dtype", [(256, False, torch.float32), (256, True, torch.float32),
                                         (200, False, torch.float32), (60, True, torch.float16),
                                         (100, True, torch.bfloat16)])
def test_every_access_inside_its_tensor(K, kda, dtype):
    from aotc.kernels.gated_delta.reference import gated_delta_reference

    case = make_case([1, 65, 0, 3], H=1, HV=2, K=K, V=K, dtype=dtype, kda=kda, strong_gates=kda, padded=(3,),
                     seed=K + kda)
    pool = case["state"].clone()
    with addresses_checked():
        out = gated_delta_prefill(case["q"], case["k"], case["v"], case["g"], case["beta"], pool,
                                  case["state_indices"], case["cu_seqlens"], qk_l2norm=True)
    ref, _ = gated_delta_reference(case["q"], case["k"], case["v"], case["g"], case["beta"], case["state"],
                                   case["state_indices"], case["cu_seqlens"], qk_l2norm=True)
    assert_close(out, ref, dtype, "out")


@triton.jit
def _read_past(X, Y, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(Y + offs, tl.load(X + offs + 1))  # element N of an N-element X


def test_the_check_catches_a_read_past_the_end():
    x, y = torch.arange(16, dtype=torch.float32), torch.empty(16)
    _read_past[(1,)](x.clone(), y, 16)  # unchecked, the interpreter reads the byte after x
    from triton.runtime.errors import InterpreterError  # the interpreter re-raises the check's Violation as one

    with addresses_checked(), pytest.raises(InterpreterError, match="Violation.*_read_past: load of 1 element"):
        _read_past[(1,)](x, y, 16)
