"""loader.mla_decode and decode's unequal-head route: bad input raises before any launch
(ValueError/TypeError naming the argument; the NaN-poisoned output stays unwritten), and
torch.compile(fullgraph=True) traces the op to the eager result."""
import pytest
import torch

from aotc import loader
from tests.cpu.kernels.mla.cases import make_case


def _latent(**over):
    case = make_case([10, 20], group=16, seed=21)
    kw = dict(q=case.q, kv_cache=case.k_cache, table=case.table, seq_lens=case.seq_lens,
              out=torch.full((2, 16, 512), float("nan"), dtype=torch.bfloat16))
    kw.update(over)
    return kw


def _run_latent(**over):
    kw = _latent(**over)
    q, kv, table, lens = kw.pop("q"), kw.pop("kv_cache"), kw.pop("table"), kw.pop("seq_lens")
    return loader.mla_decode(q, kv, table, lens, **kw)


LATENT_BAD = [
    (dict(v_head_dim=640), ValueError, "v_head_dim must be in .*, got 640"),
    (dict(v_head_dim=500), ValueError, "value head size 500: expected a multiple of 16"),
    (dict(v_head_dim=512.0), TypeError, "v_head_dim must be an int"),
    (dict(q=torch.randn(2, 16, 592).to(torch.bfloat16), kv_cache=torch.randn(8, 16, 1, 592).to(torch.bfloat16)),
     ValueError, "key head size 592"),
    (dict(q=torch.randn(2, 16, 568).to(torch.bfloat16), kv_cache=torch.randn(8, 16, 1, 568).to(torch.bfloat16)),
     ValueError, "key head size 568"),
    (dict(kv_cache=torch.randn(8, 16, 1, 512).to(torch.bfloat16)), ValueError, "kv_cache: head size 512"),
    (dict(kv_cache=torch.zeros(2, 256, 1, 576, dtype=torch.bfloat16)), ValueError, r"page size 256 .* \[1, 128\]"),
    (dict(kv_cache=torch.zeros(4, 12, 1, 576, dtype=torch.bfloat16)), ValueError, "page size 12"),
    (dict(kv_cache=torch.zeros(8, 16, 1, 576, dtype=torch.int8)), TypeError, "kv_format='fp8_e4m3'"),
    (dict(kv_cache=torch.zeros(8, 16, 3, 576, dtype=torch.bfloat16)), ValueError, "multiple of kv_heads"),
    (dict(k_scale=torch.ones(1)), ValueError, "k_scale/v_scale are for fp8 caches"),
    (dict(kv_cache=torch.zeros(8, 16, 1, 576, dtype=torch.float8_e4m3fn), k_scale=torch.ones(2)), ValueError,
     "k_scale: unequal-head decode takes one fp8 scale"),
    (dict(out=torch.full((2, 16, 576), float("nan"), dtype=torch.bfloat16)), ValueError, "out: shape"),
    (dict(q=torch.randn(2, 16, 576)), TypeError, "q must be of dtype"),
    (dict(seq_lens=torch.tensor([10, 20])), TypeError, "seq_lens must be of dtype"),
    (dict(seq_lens=torch.tensor([10, 9999], dtype=torch.int32)), ValueError, r"seq_lens\[1\] = 9999"),
    (dict(num_splits=65), ValueError, "num_splits"),
]


@pytest.mark.parametrize("over,exc,match", LATENT_BAD)
def test_latent_bad_input_raises_before_launch(over, exc, match):
    out = over.get("out", _latent()["out"])
    over = dict(over, out=out)
    with pytest.raises(exc, match=match):
        _run_latent(**over)
    assert out.isnan().all()


def test_unequal_heads_through_decode_bad_input():
    case = make_case([10], d_qk=192, d_v=128, latent=False, kv_heads=1, group=4, seed=22)
    out = torch.full((1, 4, 128), float("nan"), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="v_cache .* must match k_cache"):
        loader.decode(case.q, case.k_cache, case.v_cache[:, :8], case.table, case.seq_lens, out=out)
    with pytest.raises(ValueError, match="value head size 600"):
        loader.decode(case.q, case.k_cache, torch.zeros(*case.v_cache.shape[:3], 600, dtype=torch.bfloat16),
                      case.table, case.seq_lens)
    with pytest.raises(NotImplementedError, match="scale_layout"):
        loader.decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, scale_layout="channel")
    with pytest.raises(ValueError, match="out: shape"):
        loader.decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens,
                      out=torch.zeros(1, 4, 192, dtype=torch.bfloat16))
    assert out.isnan().all()


def test_fullgraph_compile_traces_mla_decode():
    case = make_case([20, 40], group=16, seed=23)

    def step(q, kv, table, lens):
        out, lse = loader.mla_decode(q, kv, table, lens, return_lse=True)
        return out.float() * 2, lse

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    got = compiled(case.q, case.k_cache, case.table, case.seq_lens)
    want = step(case.q, case.k_cache, case.table, case.seq_lens)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_fullgraph_compile_traces_decode_with_unequal_heads():
    case = make_case([20, 40], d_qk=192, d_v=128, latent=False, kv_heads=2, group=4, seed=24)
    latent = make_case([30], group=16, seed=25)

    def step(q, k, v, table, lens, lq, lkv, ltable, llens):
        a = loader.decode(q, k, v, table, lens)
        b = loader.decode(lq, lkv, lkv[..., :512], ltable, llens)  # a latent view: V read on its own here
        return a.float() + 1, b.float() * 2

    args = (case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, latent.q, latent.k_cache, latent.table,
            latent.seq_lens)
    got = torch.compile(step, backend="aot_eager", fullgraph=True)(*args)
    want = step(*args)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_plan_runs_layers_like_mla_decode_and_refuses_other_metadata():
    layers = [make_case([33, 70], group=16, seed=40 + i) for i in range(2)]
    first = layers[0]
    plan = loader.MLADecodePlan(first.table, first.seq_lens, q=first.q, kv_cache=first.k_cache, return_lse=True)
    for c in layers:
        c.table, c.seq_lens = first.table, first.seq_lens  # one step: every layer reads the same pages
        out = torch.full((2, 16, 512), float("nan"), dtype=torch.bfloat16)
        got, lse = plan.run(c.q, c.k_cache, out)
        want, want_lse = loader.mla_decode(c.q, c.k_cache, c.table, c.seq_lens, return_lse=True)
        assert got is out and torch.equal(got, want) and torch.equal(lse, want_lse)
    out = torch.empty(2, 16, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="kv_cache: .* this MLADecodePlan was made for"):
        plan.run(first.q, first.k_cache[:-1], out)
    with pytest.raises(TypeError, match="q: .* this MLADecodePlan"):
        plan.run(first.q.half(), first.k_cache, out)
    with pytest.raises(ValueError, match="k_scale: this MLADecodePlan was made without a scale"):
        plan.run(first.q, first.k_cache, out, k_scale=torch.ones(1))
    with pytest.raises(ValueError, match="v_head_dim must be in .*, got 600"):
        loader.MLADecodePlan(first.table, first.seq_lens, q=first.q, kv_cache=first.k_cache, v_head_dim=600)
