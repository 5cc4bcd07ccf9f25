"""decode's new variants compile to the same bytes through the AOT build as through Triton's JIT:
aligned calls of the int8 per-channel split kernel, the merge kernel with its LSE output and a
bf16 "mod" split; GENERIC calls of the kv_align 4 and 8 int8 and fp8 per-token splits on vLLM's
inline-scale layout, and the int4_zp and int4_rht splits (vLLM's INT4_PER_TOKEN_HEAD, read as stored
and rotated back in the kernel) aligned and GENERIC (tests/cpu/aot/decode_jit_sha.py, in a process
without the interpreter)."""
import pytest

from .conftest import jit_sha_pairs


@pytest.mark.parametrize("arch", [90])
def test_new_decode_variants_jit_equals_aot(arch, tmp_path):
    pairs = jit_sha_pairs("decode_jit_sha", arch, tmp_path=tmp_path)[:11]
    assert len(pairs) == 11
    for aot, jit in pairs:
        assert aot == jit
