"""library.Op (an op declared once by its schema) and rules.py (the shared argument rules)."""
import pytest
import torch

from aotc.loader.ops import library, rules
from aotc.loader.ops.decode import DECODE


def test_parse_reads_names_and_types_of_a_schema():
    name, args = library.parse("f(Tensor q, Tensor? s, str fmt, float? x, SymInt? w, Tensor(a!) out, "
                               "Tensor(b!)? lse=None, str layout=\"group\") -> ()")
    assert name == "f"
    assert args == [("q", "Tensor"), ("s", "Tensor?"), ("fmt", "str"), ("x", "float?"), ("w", "SymInt?"),
                    ("out", "Tensor"), ("lse", "Tensor?"), ("layout", "str")]


def test_an_op_whose_check_differs_from_its_schema_is_refused_at_declaration():
    def check(q, out):  # the schema says (q, scale, out)
        return q

    with pytest.raises(TypeError, match=r"takes \['q', 'out'\], the schema declares \['q', 'scale', 'out'\]"):
        library.Op("never_defined_op(Tensor q, float scale, Tensor(a!) out) -> ()", check=check, run=print)
    assert not hasattr(torch.ops.aotc, "never_defined_op")


def _decode_args(**over):
    q = torch.zeros(2, 8, 64, dtype=torch.bfloat16)
    k = torch.zeros(4, 16, 2, 64, dtype=torch.bfloat16)
    a = dict(q=q, k_cache=k, v_cache=k.clone(), table=torch.zeros(2, 4, dtype=torch.int32),
             seq_lens=torch.zeros(2, dtype=torch.int32), req_idx=None, k_scale=None, v_scale=None, kv_format="auto",
             sm_scale=None, window=None, sinks=None, num_splits=None, out=torch.empty_like(q), lse=None,
             scale_layout="group", alibi_slopes=None, alibi_sqrt=False, softcap=0.0)
    a.update(over)
    return list(a.values())


def test_the_generated_plan_key_follows_metadata_not_values():
    base = DECODE.key(*_decode_args())
    assert DECODE.key(*_decode_args()) == base  # other tensors, same metadata
    q_t = torch.zeros(8, 2, 64, dtype=torch.bfloat16).transpose(0, 1)
    assert DECODE.key(*_decode_args(q=q_t)) != base  # strides
    assert DECODE.key(*_decode_args(num_splits=1)) != DECODE.key(*_decode_args(num_splits=True))  # True == 1
    assert DECODE.key(*_decode_args(lse=torch.empty(2, 8))) != base
    meta_k = torch.empty(4, 16, 2, 64, dtype=torch.bfloat16, device="meta")
    assert DECODE.key(*_decode_args(k_cache=meta_k)) != base  # device index -1 both: is_cpu differs
    with pytest.raises(AttributeError):
        DECODE.key(*_decode_args(q=[1, 2]))  # not a tensor: the caller runs the checks instead


def test_rules_speak_one_form():
    with pytest.raises(TypeError, match=r"^op: x must be a torch.Tensor, got list$"):
        rules.tensor("op", "x", [1])
    with pytest.raises(TypeError, match=r"^op: x must be of dtype torch.int32, got torch.float32$"):
        rules.tensor("op", "x", torch.zeros(2), (torch.int32,))
    with pytest.raises(ValueError, match=r"^op: x must be 2 or 3-D, got shape \(2,\)$"):
        rules.tensor("op", "x", torch.zeros(2), dim=(2, 3))
    with pytest.raises(ValueError, match=r"^op: x must be contiguous in its last dim"):
        rules.tensor("op", "x", torch.zeros(3, 2).t(), last_contiguous=True)
    with pytest.raises(ValueError, match=r"^op: x's strides must be in \[0, 2\*\*31\)"):
        rules.strides_fit("op", {"x": torch.empty_strided((2,), (2 ** 31,), device="meta")})


def test_a_plan_cache_is_bounded_and_emptied_by_reset():
    from aotc.loader import dispatch

    cache = rules.PlanCache(limit=2)
    for i in range(3):
        cache.put(i, i)
    assert len(cache) == 1 and cache[2] == 2  # emptied when full
    cache.put(None, 5)  # a call whose key could not be computed keeps nothing
    assert len(cache) == 1
    dispatch.reset()
    assert not cache
