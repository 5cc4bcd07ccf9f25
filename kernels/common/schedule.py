"""Schedules shared by kernels whose grid covers variable-length sequences without the host
reading their lengths. `owner_of_block`: a flattened block schedule, sequence b's blocks start at
grid index starts[b] // BLOCK + b, so a grid of total // BLOCK + count indices covers them all.
`split_tokens`: the tokens one split of a split-K decode grid takes (decode's and MLA's)."""
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


@triton.jit
def split_tokens(SeqLens, b, window, max_pages, page_shift, split, num_splits, BLOCK_N: tl.constexpr):
    """Split `split` of `num_splits`'s tokens [lo, hi) of request b (hi <= lo: none).

    The length is clamped to the table (max_pages << page_shift) so no read leaves it; a window
    keeps its last `window` tokens. The BLOCK_N-token tiles are dealt out evenly (split s takes
    tiles [s * T // S, (s + 1) * T // S)), so min(T, S) splits hold work and none more than one
    tile beyond another: a count rounded up to whole tiles a split left most splits empty when
    splits outnumber a short sequence's tiles."""
    seq_len = tl.maximum(tl.minimum(tl.load(SeqLens + b), max_pages << page_shift), 0)
    start = seq_len * 0
    if window > 0:
        start = tl.maximum(seq_len - window, 0)
    tiles = tl.cdiv(seq_len - start, BLOCK_N).to(tl.int64)
    t_lo = (split * tiles // num_splits).to(tl.int32)  # int64 product: tiles x splits may pass 2^31
    t_hi = ((split + 1) * tiles // num_splits).to(tl.int32)
    lo = start + t_lo * BLOCK_N
    hi = tl.minimum(start + t_hi * BLOCK_N, seq_len)
    return lo, hi
