"""Run as a script (without TRITON_INTERPRET): the sha256 of the cubin Triton's JIT compiles for
an aligned call of the MLA family's kernels (the latent split kernel at 16, 32 and 64 heads a program,
fp8 at 16, and the merge at d_v 512: one tile, the one 256-split tile over channel blocks and the looping
form past 256 splits), beside the AOT build's compile of the same keys. Prints
pairs, one a line."""
import hashlib
import os
import sys

import torch

from aotc.aot.triton_compat import compile_variant
from aotc.kernels.decode import mla_spec as S
from aotc.kernels.variants import VariantKey, as_target_arch
from tests.cpu.aot.jit_sha import jit_sha


def aligned(n, dtype):
    t = torch.empty(n + 64, dtype=dtype)
    off = (-t.data_ptr() % 16) // t.element_size()
    return t[off:off + n]


def split_args(kv_dtype):
    q, k = aligned(4 * 16 * 576, torch.bfloat16), aligned(8 * 64 * 576, kv_dtype)
    ks, vs = aligned(4, torch.float32), aligned(4, torch.float32)
    ints = [aligned(64, torch.int32) for _ in range(3)]
    part_o, part_lse = aligned(8192, torch.float32), aligned(512, torch.float32)
    # sm_scale, window, use_req_idx, page_shift, max_pages, stride_table, q_heads, group, then the
    # aligned strides (q batch, q head, k page, k token, k head, v the same): multiples of 16
    return [q, k, k, ks, vs, *ints, part_o, part_lse, 0.0417, 0, 0, 6, 5, 5, 16, 16,
            9216, 576, 36864, 576, 576, 36864, 576, 576]


def merge_args():
    part_o, part_lse = aligned(8192, torch.float32), aligned(512, torch.float32)
    sinks, out, lse = aligned(32, torch.float32), aligned(8192, torch.bfloat16), aligned(64, torch.float32)
    return [part_o, part_lse, sinks, out, lse, 0, 1, 16, 3, 8192, 512, 16]


if __name__ == "__main__":
    assert not os.environ.get("TRITON_INTERPRET")
    arch = int(sys.argv[1])
    calls = [(S.SPLIT, S.split_axes("bf16", "bf16", 576, 512, "latent", "h16"), split_args(torch.bfloat16)),
             (S.SPLIT, S.split_axes("bf16", "fp8_e4m3", 576, 512, "latent", "h16"), split_args(torch.int8)),
             (S.SPLIT, S.split_axes("bf16", "bf16", 576, 512, "latent", "h32"), split_args(torch.bfloat16)),
             (S.MERGE, S.merge_axes("bf16", 512, 3), merge_args()),
             (S.MERGE, S.merge_axes("bf16", 512, 200), merge_args()),
             (S.MERGE, S.merge_axes("bf16", 512, 300), merge_args())]
    if S.SPLIT.launch_config(S.split_axes("bf16", "bf16", 576, 512, "latent", "h64"), as_target_arch(arch)):
        calls.append((S.SPLIT, S.split_axes("bf16", "bf16", 576, 512, "latent", "h64"), split_args(torch.bfloat16)))
    for spec, axes, args in calls:
        aot = compile_variant(spec, VariantKey.make(spec.name, axes, "aligned"), arch)
        print(hashlib.sha256(aot.cubin).hexdigest(), jit_sha(spec.name, axes, args, arch))
