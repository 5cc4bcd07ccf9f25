"""Run as a script (without TRITON_INTERPRET): the sha256 of the cubins Triton's JIT compiles for
two gated_delta_decode calls of one key, one that meets every ALIGNED assumption and one that
meets none (tests/cpu/aot/jit_sha.py does the compiling)."""
import sys

import torch

from tests.cpu.aot.jit_sha import jit_sha

AXES = {"dtype": "bf16", "k_dim": 128, "layout": "vmajor"}


def args(aligned: bool) -> list:
    off = 0 if aligned else 1  # one element: 2 bytes off for bf16, 4 for the fp32 pool
    bf = torch.empty(1 << 16, dtype=torch.bfloat16)
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
    gate_ints = [96, 32, 1, 0, 96, 32, 1, 1, 0, 0, 0, 0, 0, 1, 0]
    return ptrs + [0.088] + counts + aligned_ints + gate_ints


if __name__ == "__main__":
    arch = int(sys.argv[1])
    print(jit_sha("gated_delta_decode", AXES, args(True), arch),
          jit_sha("gated_delta_decode", AXES, args(False), arch))
