"""Run as a script (without TRITON_INTERPRET): the sha256 of the cubins Triton's JIT compiles for
two gated_delta_decode calls of one key, one that meets every ALIGNED assumption and one that
meets none (tests/cpu/aot/jit_sha.py does the compiling). Arguments: the SM, then optionally the
key (bf16, the default: the strided tile with its token loop; fp32: FP32's key, whose misaligned
call has K = 97, inside the 128 tile; packed1: the packed one-token tile, PACKED1; long: the
long packed token loop, LONG, whose state rows are split in two parts a thread)."""
import sys

import torch

from tests.cpu.aot.jit_sha import jit_sha

AXES = {"dtype": "bf16", "k_dim": 128, "layout": "vmajor", "gate": "gdn", "rows": "strided", "tokens": "any"}
FP32 = dict(AXES, dtype="fp32")
PACKED1 = dict(AXES, rows="packed", tokens="one")
LONG = dict(AXES, rows="packed", tokens="long")


def args(aligned: bool, dtype=torch.bfloat16) -> list:
    off = 0 if aligned else 1  # one element: 2 or 4 bytes off for q/k/v/out, 4 for the fp32 pool
    bf = torch.empty(1 << 16, dtype=dtype)
    pool = torch.empty(1 << 16, dtype=torch.float32)
    gates = torch.empty(4096, dtype=torch.uint8)
    idx = torch.empty(64, dtype=torch.int32)
    assert bf.data_ptr() % 16 == 0 and pool.data_ptr() % 16 == 0
    ptrs = [bf[off:], bf[8192 + off:], bf[16384 + off:], bf[24576 + off:], pool[off:], pool[32768 + off:], gates,
            gates[1:], gates[2:], gates[3:], idx]
    counts = [3, 2, 1, 100, 0]  # T, group, group_shift, num_slots, dense: never specialized
    aligned_ints = [128, 128, 8192, 4096, 128, 8192, 4096, 128, 8192, 4096, 128, 8192, 4096, 128, 524288, 16384, 128]
    if not aligned:
        aligned_ints = [v + 1 for v in aligned_ints]  # none divisible by 16 (and none equal to 1)
        aligned_ints[0] = 97  # K_DIM: a head size inside the 128 tile
    gate_ints = [96, 32, 1, 0, 96, 32, 1, 1, 0, 0, 0, 0, 0, 1, 0]
    return ptrs + [0.088] + counts + aligned_ints + gate_ints


if __name__ == "__main__":
    arch = int(sys.argv[1])
    which = sys.argv[2] if len(sys.argv) > 2 else "bf16"
    axes, dt = {"bf16": (AXES, torch.bfloat16), "fp32": (FP32, torch.float32), "packed1": (PACKED1, torch.bfloat16),
                "long": (LONG, torch.bfloat16)}[which]
    print(jit_sha("gated_delta_decode", axes, args(True, dt), arch),
          jit_sha("gated_delta_decode", axes, args(False, dt), arch))
