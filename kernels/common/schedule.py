"""Flattened block schedules shared by kernels whose grid covers several variable-length
sequences without the host reading their lengths: sequence b's blocks start at grid index
starts[b] // BLOCK + b, so a grid of total // BLOCK + count indices covers them all."""
import triton
import triton.language as tl


@triton.jit
def owner_of_block(Starts, pid, count, BLOCK: tl.constexpr):
    """The sequence owning grid index `pid`: the last b in [0, count) with
    Starts[b] // BLOCK + b <= pid (a binary search over the cumulative starts)."""
    lo = pid * 0
    hi = lo + count - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        first = tl.load(Starts + mid) // BLOCK + mid
        lo = tl.where(first <= pid, mid, lo)
        hi = tl.where(first <= pid, hi, mid - 1)
    return lo
