"""Run as a script (without TRITON_INTERPRET): the sha256 of the cubin Triton's JIT compiles for a
prefix_prefill call whose keys are all in the cache, on vLLM's INT8_PER_TOKEN_HEAD /
FP8_PER_TOKEN_HEAD record (rows 4-byte aligned, V 4 bytes past a 16-byte boundary) and on an fp8
e4m3 cache with one scale (FP8_PER_TENSOR), beside the AOT build's compile of the same
prefix_prefill_ws_rec key (its one level, ALIGNED: q and out only); args from the op's own
launch_plan. Prints one pair a line: int8, fp8 per token (bf16), fp8 per cache (fp16)."""
import hashlib
import os
import sys

import torch

from aotc.aot.triton_compat import compile_variant
from aotc.kernels.prefix_prefill import spec as S
from aotc.kernels.variants import ALIGNED, VariantKey
from aotc.loader.ops.prefix_prefill import launch_plan
from tests.cpu.aot.jit_sha import jit_sha
from tests.cpu.aot.kv_align4_jit_sha import call


def per_cache_call(dtype):
    nb, bs, kvh, heads, tokens, batch, d = 8, 16, 2, 8, 40, 2, 128
    q, out = torch.zeros(tokens, heads, d, dtype=dtype), torch.zeros(tokens, heads, d, dtype=dtype)
    kc, vc = (torch.zeros(nb, bs, kvh, d, dtype=torch.float8_e4m3fn) for _ in "kv")
    scale = torch.ones(1)
    table = torch.zeros(batch, 4, dtype=torch.int32)
    qsl, lens = torch.zeros(batch + 1, dtype=torch.int32), torch.zeros(batch, dtype=torch.int32)
    return launch_plan(q, None, None, kc, vc, table, qsl, lens, out, "nhd", "fp8_e4m3", scale, scale, 0.1, 0, None,
                       None, False)


if __name__ == "__main__":
    assert not os.environ.get("TRITON_INTERPRET")
    arch = int(sys.argv[1])
    rec = S.PREFIX_PREFILL_WS_REC
    for axes, _grid, args in (call(128, torch.bfloat16), call(128, torch.bfloat16, torch.float8_e4m3fn, "fp8_e4m3"),
                              per_cache_call(torch.float16)):
        axes = S.ws_axes(axes)
        assert S.rec_variant(axes), axes
        args = list(args[:len(rec.args)])
        aot = compile_variant(rec, VariantKey.make(rec.name, axes, ALIGNED), arch)
        print(hashlib.sha256(aot.cubin).hexdigest(), jit_sha(rec.name, axes, args, arch))
