"""prefix_prefill's binaries for vLLM's per-token-head records compile to the same bytes through the
AOT build as through Triton's JIT, on sm80 and sm90 (each script in a process without the
interpreter): the int4_zp ones ("token_zp": vLLM's INT4_PER_TOKEN_HEAD codes) for an aligned call
(tests/cpu/aot/int4_rht_jit_sha.py), and the kv_align 4 ones (int8 and fp8 e4m3 per token on the
INT8/FP8_PER_TOKEN_HEAD record, rows 4-byte aligned) at the GENERIC level, as the loader's JIT
fallback compiles them (kv_align4_jit_sha.py); and the Gluon kernel for calls whose keys are all in
the cache, kernel_ws_rec.py, on sm90 (ws_rec_jit_sha.py). decode's int4_zp split variants are in
test_decode_parity.py."""
import pytest

from .conftest import jit_sha_pairs


@pytest.mark.parametrize("script,count", [("int4_rht_jit_sha", 2), ("kv_align4_jit_sha", 4)])
@pytest.mark.parametrize("arch", [80, 90])
def test_prefix_prefill_vllm_record_binaries_jit_equal_aot(script, count, arch, tmp_path):
    pairs = jit_sha_pairs(script, arch, tmp_path=tmp_path)
    assert len(pairs) == count
    for aot, jit in pairs:
        assert aot == jit


def test_gluon_record_kernel_binaries_jit_equal_aot(tmp_path):
    # kernel_ws_rec.py (sm90 only) on the same records and on a per-cache fp8 cache (ws_rec_jit_sha.py)
    pairs = jit_sha_pairs("ws_rec_jit_sha", 90, tmp_path=tmp_path)
    assert len(pairs) == 3
    for aot, jit in pairs:
        assert aot == jit
