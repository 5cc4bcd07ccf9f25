"""Run as a script (without TRITON_INTERPRET): the sha256 of the cubin Triton's JIT compiles for
an aligned call of decode's new variants (int8 per-channel split, and the merge kernel that
writes the LSE), beside the AOT build's compile of the same keys. Prints pairs, one a line."""
import hashlib
import os
import sys

import torch

from aotc.aot.triton_compat import compile_variant
from aotc.kernels.decode import spec as S
from aotc.kernels.variants import VariantKey
from tests.cpu.aot.jit_sha import jit_sha


def aligned(n, dtype):
    t = torch.empty(n + 64, dtype=dtype)
    off = (-t.data_ptr() % 16) // t.element_size()
    return t[off:off + n]


def split_args():
    q, k, v = aligned(4096, torch.bfloat16), aligned(65536, torch.int8), aligned(65536, torch.int8)
    ks, vs = aligned(256, torch.float32), aligned(256, torch.float32)
    ints = [aligned(64, torch.int32) for _ in range(3)]
    part_o, part_lse = aligned(8192, torch.float32), aligned(512, torch.float32)
    # sm_scale, window, use_req_idx, page_shift, max_pages, stride_table, q_heads, group, quant_shift,
    # then the aligned strides (multiples of 16), then the scale strides (per-channel: 0, 0, head)
    return [q, k, v, ks, vs, *ints, part_o, part_lse, 0.088, 0, 0, 4, 16, 16, 8, 4, 7,
            1024, 128, 4096, 256, 128, 4096, 256, 128, 0, 0, 128, 0, 0, 128]


def merge_args():
    part_o, part_lse = aligned(8192, torch.float32), aligned(512, torch.float32)
    sinks, out, lse = aligned(32, torch.float32), aligned(4096, torch.bfloat16), aligned(64, torch.float32)
    return [part_o, part_lse, sinks, out, lse, 0, 1, 8, 3, 1024, 128, 8]


if __name__ == "__main__":
    assert not os.environ.get("TRITON_INTERPRET")
    arch = int(sys.argv[1])
    split = S.split_axes("bf16", "int8", "fp32", 128, channel=True)
    merge = S.merge_axes("bf16", 128, 3)
    for spec, axes, args in ((S.SPLIT, split, split_args()), (S.MERGE, merge, merge_args())):
        aot = compile_variant(spec, VariantKey.make(spec.name, axes, "aligned"), arch)
        print(hashlib.sha256(aot.cubin).hexdigest(), jit_sha(spec.name, axes, args, arch))
