"""Run as a script (without TRITON_INTERPRET): the sha256 of the cubins Triton's JIT compiles for
two gated_delta_decode calls of one key, one that meets every ALIGNED assumption and one that
meets none (tests/cpu/aot/jit_sha.py does the compiling). Arguments: the SM, then optionally the
dtype (bf16, the default, or fp32: FP32's key; its misaligned call has K = 97, inside the 128 tile)."""
import sys

import torch

from tests.cpu.aot.jit_sha import jit_sha

AXES = {"dtype": "bf16", "k_dim": 128, "layout": "vmajor", "gate": "gdn"}
FP32 = dict(AXES, dtype="fp32")


def args(aligned: bool, dtype=torch.bfloat16) -> list:
    off = 0 if aligned else 1  # one element: 2 or 4 bytes off for q/k/v/out, 4 for the fp32 pool
    bf = torch.empty(1 << 16, dtype=dtype)
    pool = torch.empty(1 << 16, dtype=torch.float32)
    gates = torch.empty(4096, dtype=torch.uint8)
    idx = torch.empty(64, dtype=torch.int32)
    assert bf.data_ptr() % 16 == 0 and pool.data_ptr() % 16 == 0
    ptrs = [bf[off:], bf[8192 + off:], bf[16384 + off:], bf[24576 + off:], pool[off:], gates, gates[1:], gates[2:],
            gates[3:], idx]
    counts = [3, 32, 2, 100]  # T, HV, group, num_slots: never specialized
    aligned_ints = [128, 128, 8192, 4096, 128, 8192, 4096, 128, 8192, 4096, 128, 8192, 4096, 128, 524288, 16384, 128]
    if not aligned:
        aligned_ints = [v + 1 for v in aligned_ints]  # none divisible by 16 (and none equal to 1)
        aligned_ints[0] = 97  # K_DIM: a head size inside the 128 tile
    gate_ints = [96, 32, 1, 0, 96, 32, 1, 1, 0, 0, 0, 0, 0, 1, 0]
    return ptrs + [0.088] + counts + aligned_ints + gate_ints


if __name__ == "__main__":
    arch = int(sys.argv[1])
    fp32 = len(sys.argv) > 2 and sys.argv[2] == "fp32"
    axes, dt = (FP32, torch.float32) if fp32 else (AXES, torch.bfloat16)
    print(jit_sha("gated_delta_decode", axes, args(True, dt), arch),
          jit_sha("gated_delta_decode", axes, args(False, dt), arch))
