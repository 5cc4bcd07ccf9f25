"""The MLA family's binaries compile to the same bytes through the AOT build as through Triton's
JIT for an aligned call (tests/cpu/aot/mla_jit_sha.py, in a process without the interpreter):
the latent split kernel (16 heads a program, bf16 and fp8; 32; 64 heads on sm90) and the merge at
d_v 512 (one tile, the 256-split tile over channel blocks, and the looping form past 256 splits),
for sm80 and sm90."""
import pytest

from .conftest import jit_sha_pairs


@pytest.mark.parametrize("arch,pairs", [(80, 6), (90, 7)])
def test_mla_variants_jit_equals_aot(arch, pairs, tmp_path):
    # line info off, as the build and the loader's JIT fallback compile
    got = jit_sha_pairs("mla_jit_sha", arch, tmp_path=tmp_path, env={"TRITON_DISABLE_LINE_INFO": "1"})
    assert len(got) == pairs
    for aot, jit in got:
        assert aot == jit
