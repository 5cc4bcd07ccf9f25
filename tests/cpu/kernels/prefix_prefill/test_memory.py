"""What the kernel reads, address by address, under the interpreter.

A proxy around the interpreter's load records every pointer whose mask is on. The checks are
the two upstream bugs and what they imply: no block-table entry past a request's own pages is
read, and no cache slot is read unless it holds context of that request within reach of its
window (so pages outside the window, and unused pages, are never touched).
"""
import numpy as np
import pytest
import torch
from triton.runtime import interpreter

from aotc.loader.ops.prefix_prefill import prefix_prefill

from .cases import make_case


class LoadRecorder:
    def __init__(self, real):
        self.real = real
        self.addresses = []

    def load(self, ptrs, mask, other, dtype):
        on = np.broadcast_to(mask, ptrs.shape)
        self.addresses.append(ptrs[on].astype(np.uint64))
        return self.real.load(ptrs, mask, other, dtype)

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.fixture
def recorder(monkeypatch):
    rec = LoadRecorder(interpreter._interpreter)
    monkeypatch.setattr(interpreter, "_interpreter", rec)
    return rec


def _inside(addrs, t):
    base = t.untyped_storage().data_ptr()
    off = addrs.astype(np.int64) - base
    inside = (off >= 0) & (off < t.untyped_storage().nbytes())
    return off[inside] // t.element_size()


def _slot_of(elem, cache, layout, which):
    """(block, slot) of element offsets into a cache."""
    s = cache.stride()
    block, rest = elem // s[0], elem % s[0]
    if layout == "nhd":
        return block, rest // s[1]
    if layout == "hnd":  # [blocks, heads, block_size, D]
        return block, (rest % s[1]) // s[2]
    if which == "k":  # [blocks, heads, D // x, block_size, x]
        return block, (rest % s[2]) // s[3]
    return block, rest % s[2]  # V [blocks, heads, D, block_size]


@pytest.mark.parametrize("layout,window,cache_dtype,extra", [
    ("nhd", None, None, {}), ("vllm", None, None, {}), ("nhd", 20, None, {}), ("vllm", 70, torch.float8_e4m3fn, {}),
    ("vllm", None, torch.float8_e5m2, {"x": 8, "head_dim": 40}),
    ("nhd", None, None, {"kv_format": "int8"}), ("hnd", 20, None, {"kv_format": "int4"}),
    ("hnd", None, None, {"kv_format": "int8", "scales": "channel"}),
    ("nhd", None, None, {"kv_format": "int8", "scales": "group"}),
    ("hnd", 20, None, {"kv_format": "int4", "scales": "group", "group": 8}),
])
def test_reads_stay_inside_each_requests_pages_and_window(recorder, layout, window, cache_dtype, extra):
    ctx, qlen, bs = [16, 0, 47, 250, 64], [5, 9, 1, 30, 3], 16
    case, kw = make_case(ctx, qlen, block_size=bs, layout=layout, cache_dtype=cache_dtype, seed=3, **extra)
    # Request 0 uses 1 page of a 16-wide row: a 64-key tile would want entries 1..3 of its row.
    prefix_prefill(**case, **kw, window=window)
    addrs = np.concatenate(recorder.addresses)

    table = case["block_table"]
    pages = [-(-c // bs) for c in ctx]
    entries = _inside(addrs, table)
    assert entries.size, "the block table was never read"
    rows, cols = entries // table.stride(0), entries % table.stride(0)
    assert (cols < np.array(pages)[rows]).all(), "read a block-table entry past a request's pages"

    owner = {}  # physical block -> (request, logical block)
    for b, n in enumerate(pages):
        for j in range(n):
            owner[int(table[b, j])] = (b, j)
    for which, cache in (("k", case["k_cache"]), ("v", case["v_cache"])):
        elem = _inside(addrs, cache)
        assert elem.size, f"the {which} cache was never read"
        blocks, slots = _slot_of(elem, cache, layout, which)
        for blk, slot in set(zip(blocks.tolist(), slots.tolist())):
            assert blk in owner, f"{which}: read block {blk}, which no request uses"
            b, j = owner[blk]
            pos = j * bs + slot
            assert pos < ctx[b], f"{which}: request {b} read position {pos} past its context {ctx[b]}"
            if window:  # its first new token sits at position ctx[b]
                assert pos > ctx[b] - window, f"{which}: request {b} read position {pos} outside window {window}"
    if kw.get("k_scale") is not None and kw["k_scale"].dim() == 4:  # a token's scale(s): the same slots only
        for name in ("k_scale", "v_scale"):
            elem = _inside(addrs, kw[name])
            assert elem.size, f"{name} was never read"
            blocks, slots = _slot_of(elem, kw[name], layout, "v")
            for blk, slot in set(zip(blocks.tolist(), slots.tolist())):
                b, j = owner[blk]
                assert j * bs + slot < ctx[b], f"{name}: request {b} read a scale past its context"
