"""Run as a script (without TRITON_INTERPRET): the sha256 of the cubins Triton's JIT compiles for
two gdn_chunk_state calls of one key, one that meets every ALIGNED assumption and one that meets
none (tests/cpu/aot/jit_sha.py does the compiling). Arguments: the SM, then the value tile (bv:
32, the default, or 128, the wide tile), then optionally the dtype (bf16 or fp32)."""
import sys

import torch

from tests.cpu.aot.jit_sha import jit_sha

AXES = {"dtype": "bf16", "head_k": 128, "head_v": 128, "bv": 32}
WIDE = dict(AXES, bv=128)
FP32 = dict(AXES, dtype="fp32")


def args(aligned: bool, dtype=torch.bfloat16, pointers_aligned=None) -> list:
    """pointers_aligned=True with aligned=False: 16-byte-aligned pointers beside head sizes off 16
    (a head size of 100 in contiguous tensors: the call dispatch serves GENERIC)."""
    off = 0 if (aligned if pointers_aligned is None else pointers_aligned) else 1  # 2 bytes off for bf16, 4 for fp32
    bf = torch.empty(1 << 16, dtype=dtype)
    f32 = torch.empty(1 << 16, dtype=torch.float32)
    idx = torch.empty(64, dtype=torch.int32)
    assert bf.data_ptr() % 16 == 0 and f32.data_ptr() % 16 == 0
    # W, U, Qs; Fq; Kg, Aqk, Out; State, Decay; Cu_seqlens, State_indices
    ptrs = ([bf[i * 8192 + off:] for i in range(3)] + [f32[16384 + off:]] + [bf[i * 8192 + off:] for i in range(3, 6)]
            + [f32[off:], f32[32768 + off:], idx, idx[8:]])
    counts = [3, 40, 32, 2]  # num_seqs, num_slots, HV, group: never specialized
    dims = [128, 128] if aligned else [127, 127]  # K_DIM, V_DIM (the head sizes inside the 128 tiles)
    q_out_strides = [2048, 128, 4096, 128] if aligned else [2049, 129, 4097, 129]
    pool_strides = [524288, 16384, 128, 1]  # never specialized
    return ptrs + counts + dims + q_out_strides + pool_strides


if __name__ == "__main__":
    arch = int(sys.argv[1])
    dtype = sys.argv[3] if len(sys.argv) > 3 else "bf16"
    axes = dict(AXES, bv=int(sys.argv[2]) if len(sys.argv) > 2 else 32, dtype=dtype)
    dt = torch.float32 if dtype == "fp32" else torch.bfloat16
    if sys.argv[4:] == ["partial"]:
        # the partly aligned call: Triton's own JIT, then the loader's fallback (its GENERIC compile)
        partial = args(False, dt, pointers_aligned=True)
        print(jit_sha("gdn_chunk_state_generic", axes, partial, arch),
              jit_sha("gdn_chunk_state_generic", axes, partial, arch, level="generic"))
    else:
        # the misaligned call's binary is GDN_CHUNK_STATE_GENERIC's (its own launch config)
        print(jit_sha("gdn_chunk_state", axes, args(True, dt), arch),
              jit_sha("gdn_chunk_state_generic", axes, args(False, dt), arch))
