"""Run as a script (without TRITON_INTERPRET): the sha256 of the cubin Triton's JIT compiles for
a call of decode's new variants, beside the AOT build's compile of the same keys: aligned calls
of the int8 per-channel split, the merge kernel that writes the LSE and a bf16 "mod" split
(softcap/ALiBi); GENERIC calls (every specializable argument off 16, as vLLM's inline-scale cache
is: rows 4-byte aligned) of the kv_align 4 and 8 int8 and fp8 per-token splits; int4_zp (vLLM's
INT4_PER_TOKEN_HEAD codes) aligned (narrow tile) and GENERIC (wide tile), and int4_rht (the same with
its rotations in the kernel) likewise. Prints pairs, one a line."""
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


def split_args(cache=torch.int8, q_dtype=torch.bfloat16):
    q, k, v = aligned(4096, q_dtype), aligned(65536, cache), aligned(65536, cache)
    ks, vs = aligned(256, torch.float32), aligned(256, torch.float32)
    ints = [aligned(64, torch.int32) for _ in range(3)]
    part_o, part_lse, alibi = aligned(8192, torch.float32), aligned(512, torch.float32), aligned(32, torch.float32)
    # sm_scale, window, use_req_idx, page_shift, max_pages, stride_table, q_heads, group, quant_shift,
    # then the aligned strides (multiples of 16), then the scale strides (per-channel: 0, 0, head),
    # softcap, alibi_mode
    return [q, k, v, ks, vs, *ints, part_o, part_lse, alibi, 0.088, 0, 0, 4, 16, 16, 8, 4, 7,
            1024, 128, 4096, 256, 128, 4096, 256, 128, 0, 0, 128, 0, 0, 128, 30.0, 2]


def vllm_split_args(cache, q_dtype=torch.bfloat16):
    """vLLM's per-token-head layout: K at a 16-byte-aligned base + 8, V 4 bytes past a 16-byte
    boundary, block/token/head strides off 16 (264 a head); q, the workspace and their strides off 16."""
    base = aligned(1 << 18, torch.uint8)
    k, v = base[8:].view(cache), base[132:].view(cache)
    q = aligned(8192, q_dtype)[2:]
    ks, vs = aligned(256, torch.float32)[1:], aligned(256, torch.float32)[2:]
    ints = [aligned(64, torch.int32)[1:] for _ in range(3)]
    part_o, part_lse, alibi = (aligned(n, torch.float32)[1:] for n in (8192, 512, 32))
    return [q, k, v, ks, vs, *ints, part_o, part_lse, alibi, 0.088, 0, 0, 4, 16, 17, 8, 4, 7,
            1032, 129, 33800, 2120, 264, 33800, 2120, 264, 8448, 528, 66, 8448, 528, 66, 0.0, 0]


def merge_args():
    part_o, part_lse = aligned(8192, torch.float32), aligned(512, torch.float32)
    sinks, out, lse = aligned(32, torch.float32), aligned(4096, torch.bfloat16), aligned(64, torch.float32)
    return [part_o, part_lse, sinks, out, lse, 0, 1, 8, 3, 1024, 128, 8]


if __name__ == "__main__":
    assert not os.environ.get("TRITON_INTERPRET")
    arch = int(sys.argv[1])
    split = S.split_axes("bf16", "int8", "fp32", 128, channel=True)
    merge = S.merge_axes("bf16", 128, 3)
    mod = S.split_axes("bf16", "bf16", "fp32", 128, score="mod")
    int8_a4 = S.split_axes("bf16", "int8", "fp32", 128, per_token=True, score="mod", kv_align=4)
    fp8_a4 = S.split_axes("bf16", "fp8_e4m3", "fp32", 128, per_token=True, kv_align=4)
    int8_a8 = S.split_axes("bf16", "int8", "fp32", 128, per_token=True, kv_align=8)
    fp8_a8 = S.split_axes("bf16", "fp8_e4m3", "fp32", 128, per_token=True, score="mod", kv_align=8)
    zp_narrow = dict(S.split_axes("bf16", "int4_zp", "fp32", 128, per_token=True), tile="narrow")
    zp_wide = dict(S.split_axes("fp16", "int4_zp", "fp32", 128, per_token=True), tile="wide")
    rht_narrow = dict(S.split_axes("fp16", "int4_rht", "fp32", 64, per_token=True), tile="narrow")
    rht_wide = dict(S.split_axes("bf16", "int4_rht", "fp32", 128, per_token=True), tile="wide")
    for spec, axes, args, level in ((S.SPLIT, split, split_args(), "aligned"), (S.MERGE, merge, merge_args(), "aligned"),
                                    (S.SPLIT, mod, split_args(torch.bfloat16), "aligned"),
                                    (S.SPLIT, int8_a4, vllm_split_args(torch.int8), "generic"),
                                    (S.SPLIT, fp8_a4, vllm_split_args(torch.int8), "generic"),
                                    (S.SPLIT, int8_a8, vllm_split_args(torch.int8), "generic"),
                                    (S.SPLIT, fp8_a8, vllm_split_args(torch.int8), "generic"),
                                    (S.SPLIT, zp_narrow, split_args(), "aligned"),
                                    (S.SPLIT, zp_wide, vllm_split_args(torch.int8, torch.float16), "generic"),
                                    (S.SPLIT, rht_narrow, split_args(torch.int8, torch.float16), "aligned"),
                                    (S.SPLIT, rht_wide, vllm_split_args(torch.int8), "generic")):
        aot = compile_variant(spec, VariantKey.make(spec.name, axes, level), arch)
        print(hashlib.sha256(aot.cubin).hexdigest(), jit_sha(spec.name, axes, args, arch))
