"""Schedules shared by kernels whose grid covers variable-length sequences without the host
reading their lengths. `owner_of_block`: a flattened block schedule, sequence b's blocks start at
grid index starts[b] // BLOCK + b, so a grid of total // BLOCK + count indices covers them all.
`split_tokens`: the tokens one split of a split-K decode grid takes; `split_program`: what a program
of decode's and MLA's split grids works on (heads, tokens, table row)."""
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
    """(lo, hi, seq_len): split `split` of `num_splits`'s tokens [lo, hi) of request b (hi <= lo:
    none) and the request's clamped length. The split is a chunk of
    cdiv(length, num_splits) tokens rounded up to whole BLOCK_N tiles, so a short sequence takes
    fewer splits rather than more programs with the same longest one (dealing the tiles out evenly
    measured slower: BENCHMARKS.md, "MLA decode"). The length is clamped to the table
    (max_pages << page_shift) so no read leaves it; a window keeps its last `window` tokens."""
    seq_len = tl.maximum(tl.minimum(tl.load(SeqLens + b), max_pages << page_shift), 0)
    start = seq_len * 0
    if window > 0:
        start = tl.maximum(seq_len - window, 0)
    chunk = tl.cdiv(tl.cdiv(seq_len - start, num_splits), BLOCK_N) * BLOCK_N
    lo = start + split * chunk
    hi = tl.minimum(lo + chunk, seq_len)
    return lo, hi, seq_len


@triton.jit
def split_program(SeqLens, Table, ReqIdx, window, use_req_idx, max_pages, page_shift, stride_table, group,
                  BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr):
    """Program (g, b, s) of a split grid (kv_heads * cdiv(group, BLOCK_H), batch, num_splits):
    (b, s, num_splits, its KV head, mask and ids of its BLOCK_H query heads, its tokens [lo, hi),
    the request's clamped length, the request's page-table row (ReqIdx[b] where use_req_idx))."""
    b = tl.program_id(1)
    pid_h = tl.program_id(0)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    h_blocks = tl.cdiv(group, BLOCK_H)
    kvh = pid_h // h_blocks
    offs_g = (pid_h % h_blocks) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs_g < group
    heads = kvh * group + offs_g

    lo, hi, seq_len = split_tokens(SeqLens, b, window, max_pages, page_shift, split, num_splits, BLOCK_N)

    row = b
    if use_req_idx != 0:
        row = tl.load(ReqIdx + b)
    table_row = Table + row.to(tl.int64) * stride_table
    return b, split, num_splits, kvh, h_mask, heads, lo, hi, seq_len, table_row
