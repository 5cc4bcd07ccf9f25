"""bench/probe_decode_read.py's read kernel reads every byte of the cache region its page tables
cover exactly once, for each read pattern it times (the probe checks the same sum on the GPU)."""
import sys
from pathlib import Path

import pytest
import torch

from aotc.loader.interpreter import patch_interpreter

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
patch_interpreter()

import probe_decode_read as P  # noqa: E402

CASES = [  # (heads, block_n, table, scales, stages, layout)
    (1, 16, 0, 1, 1, "nhd"), (1, 32, 1, 2, 3, "hnd"), (2, 16, 2, 1, 2, "nhd"), (2, 32, 2, 2, 1, "hnd"),
    (8, 16, 0, 2, 3, "nhd"), (8, 16, 1, 1, 1, "hnd"), (4, 16, 2, 0, 1, "nhd"),
]


@pytest.mark.parametrize("fmt", ["int8", "int4g8", "bf16"])
@pytest.mark.parametrize("batch,ctx,page,splits", [(2, 64, 16, 1), (3, 96, 8, 3), (1, 128, 64, 2)])
def test_reads_each_token_once(fmt, batch, ctx, page, splits):
    c = P.Caches(fmt, 3 * 128, "cpu", bound=1000)
    table = c.table(batch, ctx, page, seed=batch)
    for heads, block_n, tab, scales, stages, layout in CASES:
        cfg = dict(P.BASE, heads=heads, block_n=block_n, table=tab, scales=scales, stages=stages, layout=layout)
        out = torch.full((P.H // heads * batch * splits,), -7, dtype=torch.int32)
        args, kw = P.kernel_args(c, table, ctx, page, cfg, splits, out)
        kw.pop("num_warps"), kw.pop("num_stages")
        P.read_kernel[(P.H // heads, batch, splits)](*args, **kw)
        got = int(out.to(torch.int64).sum()) % 2**32
        assert got == c.expected(batch * ctx, bool(c.GS) and scales != 0), cfg


def test_a_missed_token_changes_the_sum():
    # The check can fail: a table that repeats a page in place of another is caught.
    c = P.Caches("int8", 128, "cpu", bound=1000)
    table = c.table(2, 64, 16)
    table[1, 0] = table[0, 0]
    out = torch.zeros(P.H * 2, dtype=torch.int32)
    args, kw = P.kernel_args(c, table, 64, 16, dict(P.BASE, block_n=16), 1, out)
    kw.pop("num_warps"), kw.pop("num_stages")
    P.read_kernel[(P.H, 2, 1)](*args, **kw)
    assert int(out.to(torch.int64).sum()) % 2**32 != c.expected(2 * 64, True)
