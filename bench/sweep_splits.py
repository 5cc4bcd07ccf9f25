"""Split-count sweep for decode and MLA decode, for choosing kernels/decode/spec.num_splits: each
shape at the default rule's count and at the counts listed here (the op's `num_splits`), % of the
device-to-device copy bandwidth of the same run (bytes read once over device time, L2 emptied
before each call: harness.device_time).

    python3 sweep_splits.py [--out ROWS] [--mla] [--decode] [--stages] [--regs]

--mla: bf16 latent cache [pages, 64, 1, 576] (bench_mla.problem) at 16 and 128 heads.
--decode: 32 query / 8 KV heads, D 128, page 16, bf16 / int8 one scale a token / int4 groups of 8
(bench_decode.make), batch 1 at 8K and 32K; --decode-large: int8 and int4 at batch 32 and 128 x 8K,
one to several waves of programs (whether more, shorter programs even out SMs that read at
different speeds: bench/mla_timeline.py). --stages: MLA's 16-head split kernel at 2-4 stages
through the JIT (bench_mla.sweep) at the counts in STAGE_SHAPES. --regs: the same kernel under
register caps (REGS), each at the split count its occupancy gets.
"""
from __future__ import annotations

import argparse
import warnings

import torch

from aotc import loader
from aotc.loader.ops import decode as decode_ops
from aotc.loader.ops import mla as mla_ops
from bench_decode import make
from bench_mla import D_QK, D_V, problem, sweep
from harness import Rows, copy_bandwidth, device_time

MLA = {  # (heads, batch, context) -> split counts tried beside the rule's
    (16, 1, 4096): (32, 64, 128, 132, 264, 396, 512), (16, 1, 32768): (64, 132, 198, 264, 396, 512),
    (16, 32, 4096): (8, 12, 16, 24, 33, 48), (16, 32, 32768): (12, 24, 33),
    (16, 128, 4096): (3, 4, 6, 8, 12), (128, 1, 4096): (32, 64, 66, 132), (128, 1, 32768): (64, 66, 132, 198),
    (128, 32, 4096): (1, 2, 3, 4),
}
DECODE = {(1, 8192): (32, 64, 96, 128, 192, 256), (1, 32768): (48, 64, 96, 128, 192, 256)}
DECODE_LARGE = {(32, 8192): (1, 2, 3, 4, 6, 8, 12, 16), (128, 8192): (1, 2, 3, 4, 6, 8)}
FORMATS = (("bf16", 0), ("int8", 128), ("int4", 8))
STAGES = ((16, 32, 4, 2), (16, 32, 4, 3), (16, 32, 4, 4))
STAGE_SHAPES = {(16, 1, 32768): 132, (16, 32, 4096): 24}
# --regs: the 16-head tile (2 programs an SM) beside register caps that fit 3, each at the split
# count mla_spec.num_splits gives that occupancy
# (two stages of 32 x 576 bf16 keys take 74 KB of shared memory: three programs an SM at most)
REGS = ((16, 32, 4, 2), (16, 32, 4, 2, 168), (16, 32, 4, 2, 128))
REG_SHAPES = ((16, 1, 4096), (16, 1, 32768), (16, 32, 4096), (16, 32, 32768), (16, 128, 4096))
PER_SM = {None: 2, 168: 3, 128: 3}


def timed(fn, nbytes, copy_bw):
    t = device_time(fn, rep_ms=100)
    return t * 1e6, 100 * nbytes / t / copy_bw


def rule_splits(plans) -> int:
    (plan,) = plans.values()
    grid = plan.split_grid if hasattr(plan, "split_grid") else plan[0].split_grid
    return grid[2]


def mla(rows, copy_bw):
    for (heads, batch, ctx), counts in MLA.items():
        q, kv, table, lens = problem(batch, heads, ctx)
        out = torch.empty(batch, heads, D_V, dtype=q.dtype, device="cuda")
        nbytes = batch * ctx * D_QK * 2
        shape = f"B{batch}xH{heads}x{ctx}"
        mla_ops._plans.clear()
        for s in (None, *counts):
            us, pct = timed(lambda: loader.mla_decode(q, kv, table, lens, v_head_dim=D_V, out=out, num_splits=s,
                                                      validate=False), nbytes, copy_bw)
            if s is None:
                s = rule_splits(mla_ops._plans)
                label = f"rule({s})"
            else:
                label = str(s)
            print(f"  mla {shape:>16} splits {label:>9}: {us:8.1f} us {pct:5.1f}% copy")
            rows.add("mla_decode", "latent-bf16-p64", f"splits-{label}", shape, "pct_copy", pct)
        del q, kv, table, lens
        torch.cuda.empty_cache()


def decode(rows, copy_bw, shapes=DECODE, formats=FORMATS):
    for fmt, group in formats:
        for (batch, ctx), counts in shapes.items():
            args, kw, nbytes = make(fmt, batch, ctx, 32, 8, 128, 16, group=group or 64)
            out = torch.empty_like(args[0])
            shape = f"b{batch} ctx{ctx} h32/8 d128 page16"
            decode_ops._plans.clear()
            for s in (None, *counts):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # a JIT fallback where the binary was not built
                    us, pct = timed(lambda: loader.decode(*args, **kw, out=out, num_splits=s, validate=False),
                                    nbytes, copy_bw)
                label = f"rule({rule_splits(decode_ops._plans)})" if s is None else str(s)
                print(f"  decode {fmt}:{group} {shape} splits {label:>9}: {us:8.1f} us {pct:5.1f}% copy")
                rows.add("decode", f"{fmt} group{group}" if group else fmt, f"splits-{label}", shape, "pct_of_copy",
                         pct)
            del args, kw, out
            torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None)
    ap.add_argument("--mla", action="store_true")
    ap.add_argument("--decode", action="store_true")
    ap.add_argument("--decode-large", action="store_true")
    ap.add_argument("--stages", action="store_true")
    ap.add_argument("--regs", action="store_true")
    ap.add_argument("--rule-only", action="store_true", help="only the default rule's count (an older checkout)")
    a = ap.parse_args()
    if a.rule_only:
        for table in (MLA, DECODE, DECODE_LARGE):
            for k in table:
                table[k] = ()
    rows = Rows(a.out)
    copy_bw = copy_bandwidth()
    print(f"device-to-device copy: {copy_bw / 1e9:.0f} GB/s")
    rows.add("copy", "d2d", "copy", "2GiB", "GBps", copy_bw / 1e9)
    if a.mla:
        mla(rows, copy_bw)
    if a.decode:
        decode(rows, copy_bw)
    if a.decode_large:
        decode(rows, copy_bw, DECODE_LARGE, FORMATS[1:])
    if a.stages:
        shapes = tuple(STAGE_SHAPES)
        sweep(rows, copy_bw, shapes, STAGES, lambda h, b, c: STAGE_SHAPES[(h, b, c)])
    if a.regs:
        from aotc.kernels.decode import mla_spec

        sms = torch.cuda.get_device_properties(0).multi_processor_count
        sweep(rows, copy_bw, REG_SHAPES, REGS,
              lambda h, b, c, cap=None: mla_spec.num_splits(b, 1, h, "h16", sms, PER_SM[cap]))


if __name__ == "__main__":
    main()
