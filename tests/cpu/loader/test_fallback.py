"""The JIT fallback on a miss: warning once, the miss log, AOTC_DISABLE_JIT, and the result
(computed here by Triton's interpreter on CPU tensors)."""
import json
import warnings

import pytest
import torch

from aotc.kernels.registry import get_spec
from aotc.kernels.variants import VariantKey
from aotc.loader import dispatch, fallback


@pytest.fixture
def miss_log(tmp_path, monkeypatch):
    path = tmp_path / "misses.jsonl"
    monkeypatch.setenv("AOTC_MISS_LOG", str(path))
    monkeypatch.setattr(fallback, "_warned", set())
    return path


def test_a_miss_runs_through_triton_warns_once_and_is_logged(miss_log):
    spec = get_spec("tiny_axpy")
    axes = {"block": 32, "dtype": "fp32"}
    sel = dispatch.Selection(spec, axes, 0, None, (9, 0))  # no artifacts for this device
    x, y = torch.randn(3, 40), torch.randn(3, 40)
    for _ in range(2):
        out = torch.full((3, 40), float("nan"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sel.launch((3, 2, 1), [x, y, out, 40, 40, 3, 0.5], stream=0)
        torch.testing.assert_close(out, 0.5 * x + y, rtol=1e-6, atol=1e-6)
        if _ == 0:
            assert any("tiny_axpy(block=32,dtype=fp32)@generic is not built for sm90" in str(w.message) for w in caught)
        else:
            assert not [w for w in caught if issubclass(w.category, fallback.AotcJitFallbackWarning)]
    lines = [json.loads(l) for l in miss_log.read_text().splitlines()]
    assert [(l["key"], l["target"]) for l in lines] == [("tiny_axpy(block=32,dtype=fp32)@generic", "sm90")]
    assert fallback.read_misses(miss_log) == [(VariantKey.parse(lines[0]["key"]), "sm90")]


def test_disabled_jit_turns_a_miss_into_an_error_naming_key_and_command(miss_log, monkeypatch):
    monkeypatch.setenv("AOTC_DISABLE_JIT", "1")
    sel = dispatch.Selection(get_spec("tiny_axpy"), {"block": 32, "dtype": "fp32"}, 0, None, (9, 0))
    x = torch.randn(1, 8)
    with pytest.raises(fallback.MissingVariantError) as err:
        sel.launch((1, 1, 1), [x, x, x.clone(), 8, 8, 1, 1.0], stream=0)
    assert "tiny_axpy(block=32,dtype=fp32)@generic" in str(err.value) and "aotc build --arch sm90" in str(err.value)
    assert not miss_log.exists()


def test_a_malformed_miss_log_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"key": "not a key"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        fallback.read_misses(bad)
