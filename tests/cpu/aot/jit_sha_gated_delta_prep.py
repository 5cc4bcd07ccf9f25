"""Run as a script (without TRITON_INTERPRET): the sha256 of the cubins Triton's JIT compiles for
two gdn_chunk_prep calls of one key (KDA, bf16, K = V = 128), one that meets every ALIGNED
assumption and one that meets none (tests/cpu/aot/jit_sha.py does the compiling). Argument: the SM."""
import sys

import torch

from tests.cpu.aot.jit_sha import jit_sha

AXES = {"dtype": "bf16", "head_k": 128, "head_v": 128, "gate": "kda"}


def args(aligned: bool) -> list:
    off = 0 if aligned else 1  # 2 bytes off for bf16, 4 for fp32
    bf = torch.empty(1 << 16, dtype=torch.bfloat16)
    f32 = torch.empty(1 << 16, dtype=torch.float32)
    idx = torch.empty(64, dtype=torch.int32)
    assert bf.data_ptr() % 16 == 0 and f32.data_ptr() % 16 == 0
    # Q, K, V; G, Beta; W, U, Qg; Fq; Kg, Aqk; Decay; Cu_seqlens, State_indices
    ptrs = ([bf[i * 8192 + off:] for i in range(3)] + [f32[off:], f32[8192 + off:]]
            + [bf[i * 8192 + off:] for i in range(3, 6)] + [f32[16384 + off:]]
            + [bf[i * 8192 + off:] for i in range(6, 8)] + [f32[32768 + off:], idx, idx[8:]])
    scalars = [0.088, 1, 3, 40, 32, 2]  # scale, qk_l2norm, num_seqs, num_slots, HV, group
    dims = [128, 128] if aligned else [127, 127]  # K_DIM, V_DIM (head sizes inside the 128 tiles)
    qkv_strides = [2048, 128, 2048, 128, 4096, 128] if aligned else [2049, 129, 2049, 129, 4097, 129]
    gate_strides = [4096, 128, 32, 1]  # never specialized
    return ptrs + scalars + dims + qkv_strides + gate_strides


if __name__ == "__main__":
    arch = int(sys.argv[1])
    print(jit_sha("gdn_chunk_prep", AXES, args(True), arch), jit_sha("gdn_chunk_prep", AXES, args(False), arch))
