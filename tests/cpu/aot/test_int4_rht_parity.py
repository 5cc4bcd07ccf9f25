"""prefix_prefill's int4_zp binaries ("token_zp": vLLM's INT4_PER_TOKEN_HEAD codes) compile to the
same bytes through the AOT build as through Triton's JIT for an aligned call, on sm80 and sm90
(tests/cpu/aot/int4_rht_jit_sha.py, in a process without the interpreter). decode's int4_zp split
variants are in test_decode_parity.py."""
import pytest

from .conftest import jit_sha_pairs


@pytest.mark.parametrize("arch", [80, 90])
def test_prefix_prefill_int4_zp_jit_equals_aot(arch, tmp_path):
    pairs = jit_sha_pairs("int4_rht_jit_sha", arch, tmp_path=tmp_path)
    assert len(pairs) == 2
    for aot, jit in pairs:
        assert aot == jit
