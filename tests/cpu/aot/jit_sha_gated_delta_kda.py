"""Run as a script (without TRITON_INTERPRET): the sha256 of the cubins Triton's JIT compiles for
two calls of one key of a KDA precompute kernel (bf16, K = V = 128), one that meets every ALIGNED
assumption and one that meets none (tests/cpu/aot/jit_sha.py does the compiling). Arguments: the
SM and the kernel ("kda_chunk_intra", "kda_chunk_inter" or "kda_chunk_wy")."""
import sys

import torch

from tests.cpu.aot.jit_sha import jit_sha

A_AXES = {"dtype": "bf16", "head_k": 128}
WY_AXES = {"dtype": "bf16", "head_k": 128, "head_v": 128}


def _buffers(aligned: bool):
    off = 0 if aligned else 1  # 2 bytes off for bf16, 4 for fp32
    bf = torch.empty(1 << 16, dtype=torch.bfloat16)
    f32 = torch.empty(1 << 16, dtype=torch.float32)
    assert bf.data_ptr() % 16 == 0 and f32.data_ptr() % 16 == 0
    return ([bf[i * 8192 + off:] for i in range(8)], [f32[i * 8192 + off:] for i in range(8)],
            torch.empty(64, dtype=torch.int32))


def _tail(aligned: bool) -> list:
    scalars = [0.088, 1, 3, 40, 32, 2]  # scale, qk_l2norm, num_seqs, num_slots, HV, group
    dims = [128] if aligned else [127]  # K_DIM (a head size inside the 128 tile)
    qk_strides = [2048, 128, 2048, 128] if aligned else [2049, 129, 2049, 129]
    # the gate's (s_gt, s_gh: kda_chunk_intra's ALIGNED level has them, the other kernels never
    # specialize them) and beta's (never specialized)
    gate_strides = [4096, 128, 32, 1] if aligned else [4097, 129, 32, 1]
    return scalars + dims + qk_strides + gate_strides


def intra_args(aligned: bool) -> list:
    bf, f32, idx = _buffers(aligned)
    # Q, K; G, Beta; Aqk; Akk; Cu_seqlens, State_indices
    return bf[:2] + f32[:2] + [bf[2], f32[2], idx, idx[8:]] + _tail(aligned)


def inter_args(aligned: bool) -> list:
    bf, f32, idx = _buffers(aligned)
    # Q, K; G, Beta; W, Qg; Fq; Kg, Aqk; Akk, Decay; Cu_seqlens, State_indices
    return bf[:2] + f32[:2] + bf[2:4] + [f32[2]] + bf[4:6] + f32[3:5] + [idx, idx[8:]] + _tail(aligned)


def wy_args(aligned: bool) -> list:
    bf, f32, idx = _buffers(aligned)
    # Akk, V, Beta, W, U, Cu_seqlens, State_indices
    ptrs = [f32[0], bf[0], f32[1], bf[1], bf[2], idx, idx[8:]]
    scalars = [3, 40, 32]  # num_seqs, num_slots, HV
    dims = [128, 128] if aligned else [127, 127]  # K_DIM, V_DIM
    v_strides = [4096, 128] if aligned else [4097, 129]
    return ptrs + scalars + dims + v_strides + [32, 1]


ARGS = {"kda_chunk_intra": ("A_AXES", intra_args), "kda_chunk_inter": ("A_AXES", inter_args),
        "kda_chunk_wy": ("WY_AXES", wy_args)}


if __name__ == "__main__":
    arch, kernel = int(sys.argv[1]), sys.argv[2]
    axes, args = ARGS[kernel]
    print(jit_sha(kernel, globals()[axes], args(True), arch), jit_sha(kernel, globals()[axes], args(False), arch))
