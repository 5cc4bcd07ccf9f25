"""The decode fast path: a call whose inputs have a checked call's metadata reuses its plan, and
any change of shape, stride, dtype or scalar argument makes a new, checked plan."""
import pytest
import torch

import aotc.loader.ops.decode as D
from tests.cpu.kernels.decode.cases import assert_close, make_case


def test_repeat_calls_reuse_one_plan_and_stay_correct():
    D._plans.clear()
    case = make_case([5, 70], fmt="int4")
    for _ in range(2):
        out = torch.full_like(case.q, float("nan"))
        D.decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, out=out, validate=False, **case.kwargs)
        assert_close(out, case.reference())
    assert len(D._plans) == 1
    # New values, same metadata: the plan is reused and the answer follows the values.
    case.q.copy_(torch.randn_like(case.q))
    case.seq_lens.copy_(torch.tensor([64, 1], dtype=torch.int32))
    out = torch.full_like(case.q, float("nan"))
    D.decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, out=out, validate=False, **case.kwargs)
    assert_close(out, case.reference())
    assert len(D._plans) == 1


def test_changed_metadata_is_checked_again():
    D._plans.clear()
    case = make_case([9], fmt="bf16")
    D.decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, validate=False)
    with pytest.raises(TypeError, match="seq_lens"):
        D.decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens.long(), validate=False)
    with pytest.raises(ValueError, match="q"):
        D.decode(case.q.transpose(1, 2), case.k_cache, case.v_cache, case.table, case.seq_lens, validate=False)
    with pytest.raises(ValueError, match="window"):
        D.decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, window=0, validate=False)
    with pytest.raises(TypeError, match="k_cache"):
        D.decode(case.q, [1, 2], case.v_cache, case.table, case.seq_lens, validate=False)
    assert len(D._plans) == 1
