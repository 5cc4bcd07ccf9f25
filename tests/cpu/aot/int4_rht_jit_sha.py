"""Run as a script (without TRITON_INTERPRET): the sha256 of the cubin Triton's JIT compiles for a
prefix_prefill call over an int4_zp cache (vLLM's INT4_PER_TOKEN_HEAD codes, scales "token_zp"),
beside the AOT build's compile of the same key; args from the op's own launch_plan on an aligned
call. Prints one pair a line: head dim 128 bf16 and head dim 64 fp16."""
import hashlib
import os
import sys

import torch

from aotc.aot.triton_compat import compile_variant
from aotc.kernels.prefix_prefill import spec as S
from aotc.kernels.variants import VariantKey
from aotc.loader.ops.prefix_prefill import launch_plan
from tests.cpu.aot.jit_sha import jit_sha


def aligned(shape, dtype):
    n = 1
    for s in shape:
        n *= s
    t = torch.zeros(n + 64, dtype=dtype)
    off = (-t.data_ptr() % 16) // t.element_size()
    return t[off:off + n].view(shape)


def call(head_dim, dtype):
    nb, bs, kvh, heads, tokens, batch = 8, 16, 2, 8, 40, 2
    q, out = aligned((tokens, heads, head_dim), dtype), aligned((tokens, heads, head_dim), dtype)
    kc, vc = aligned((nb, bs, kvh, head_dim // 2), torch.uint8), aligned((nb, bs, kvh, head_dim // 2), torch.uint8)
    ks, vs = aligned((nb, bs, kvh, 1), torch.float32), aligned((nb, bs, kvh, 1), torch.float32)
    table = aligned((batch, 4), torch.int32)
    qsl, lens = aligned((batch + 1,), torch.int32), aligned((batch,), torch.int32)
    return launch_plan(q, None, None, kc, vc, table, qsl, lens, out, "nhd", "int4_zp", ks, vs, 0.1, 0, None, None,
                       False)


if __name__ == "__main__":
    assert not os.environ.get("TRITON_INTERPRET")
    arch = int(sys.argv[1])
    for head_dim, dtype in ((128, torch.bfloat16), (64, torch.float16)):
        axes, grid, args = call(head_dim, dtype)
        assert axes["scales"] == "token_zp", axes
        aot = compile_variant(S.PREFIX_PREFILL, VariantKey.make(S.PREFIX_PREFILL.name, axes, "aligned"), arch)
        print(hashlib.sha256(aot.cubin).hexdigest(), jit_sha(S.PREFIX_PREFILL.name, axes, list(args), arch))
