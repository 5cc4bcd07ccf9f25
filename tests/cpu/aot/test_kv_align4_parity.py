"""prefix_prefill's kv_align 4 binaries (int8 and fp8 e4m3 per token on vLLM's INT8/FP8_PER_TOKEN_HEAD
record, rows 4-byte aligned) compile to the same bytes through the AOT build's GENERIC level as through the
loader's JIT fallback at that level, on sm80 and sm90 (tests/cpu/aot/kv_align4_jit_sha.py, in a
process without the interpreter)."""
import pytest

from .conftest import jit_sha_pairs


@pytest.mark.parametrize("arch", [80, 90])
def test_prefix_prefill_kv_align4_jit_equals_aot(arch, tmp_path):
    pairs = jit_sha_pairs("kv_align4_jit_sha", arch, tmp_path=tmp_path)
    assert len(pairs) == 4
    for aot, jit in pairs:
        assert aot == jit
