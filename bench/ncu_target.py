"""A few decode calls of one format and shape, for ncu to profile (`--kernel-name regex:decode_split`).
usage: python ncu_target.py FORMAT GROUP BATCH CONTEXT  (bf16 query, 32/8 heads, d128, page 16)"""
import sys

import torch

from aotc import loader
from bench_decode import make
from harness import L2Flush

fmt, group, batch, ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
args, kw, _ = make(fmt, batch, ctx, 32, 8, 128, 16, group=group or 64)
out = torch.empty_like(args[0])
flush = L2Flush("clean")
for _ in range(3):
    flush()
    loader.decode(*args, **kw, out=out, validate=False)
torch.cuda.synchronize()
