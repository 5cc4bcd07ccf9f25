"""Run as a script (without TRITON_INTERPRET): the sha256 of the cubin Triton's JIT compiles for a
prefix_prefill call over vLLM's INT8_PER_TOKEN_HEAD / FP8_PER_TOKEN_HEAD record ([K codes | K scale | V codes | V scale]
a token and kv head: rows 4-byte aligned, not 16), beside the AOT build's GENERIC compile of the
same key (kv_align 4); args from the op's own launch_plan, compiled by the function the loader's JIT
fallback takes at that level (the record's cache pointers happen to be 16-byte aligned here). Prints one pair a line: int8
head dim 128 bf16 and head dim 64 fp16, then fp8 e4m3 the same."""
import hashlib
import os
import sys

import torch

from aotc.aot.triton_compat import compile_variant
from aotc.kernels.prefix_prefill import spec as S
from aotc.kernels.variants import GENERIC, VariantKey
from aotc.loader.ops.prefix_prefill import launch_plan
from tests.cpu.aot.jit_sha import jit_sha


def call(head_dim, dtype, codes=torch.int8, fmt="int8"):
    nb, bs, kvh, heads, tokens, batch = 8, 16, 2, 8, 40, 2
    q, out = torch.zeros(tokens, heads, head_dim, dtype=dtype), torch.zeros(tokens, heads, head_dim, dtype=dtype)
    raw = torch.zeros(nb, bs, kvh, 2 * (head_dim + 4), dtype=torch.uint8)
    f32 = raw.view(torch.float32)
    kc, vc = raw[..., :head_dim].view(codes), raw[..., head_dim + 4:2 * head_dim + 4].view(codes)
    ks, vs = f32[..., head_dim // 4:head_dim // 4 + 1], f32[..., (2 * head_dim + 4) // 4:(2 * head_dim + 4) // 4 + 1]
    table = torch.zeros(batch, 4, dtype=torch.int32)
    qsl, lens = torch.zeros(batch + 1, dtype=torch.int32), torch.zeros(batch, dtype=torch.int32)
    return launch_plan(q, None, None, kc, vc, table, qsl, lens, out, "nhd", fmt, ks, vs, 0.1, 0, None, None,
                       False)


if __name__ == "__main__":
    assert not os.environ.get("TRITON_INTERPRET")
    arch = int(sys.argv[1])
    for (head_dim, dtype), codes in [(c, k) for k in ((torch.int8, "int8"), (torch.float8_e4m3fn, "fp8_e4m3"))
                                     for c in ((128, torch.bfloat16), (64, torch.float16))]:
        axes, grid, args = call(head_dim, dtype, *codes)
        assert axes.get("kv_align") == 4, axes
        aot = compile_variant(S.PREFIX_PREFILL, VariantKey.make(S.PREFIX_PREFILL.name, axes, GENERIC), arch)
        print(hashlib.sha256(aot.cubin).hexdigest(), jit_sha(S.PREFIX_PREFILL.name, axes, list(args), arch, GENERIC))
