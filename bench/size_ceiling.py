"""What a device-to-device copy of decode's byte count reaches, as % of the 2 GiB copy bandwidth
that bench_decode.py divides by, timed the same ways (events around the call; and chained behind
the L2-emptying read). A call that moves 138 MB (int4, batch 32 x 4K) pays its launch, ramp-up and
tail over far fewer bytes than the 2 GiB copy does: this measures how much of the goal's
denominator that alone costs, with no paging and no math. (A torch.sum read was tried as a second
reference and dropped: it ran at 15-19% of copy, bound by its own reduction, not by memory.)"""
from __future__ import annotations

import torch

from bench_decode import SHAPES, make
from harness import chained_time, device_time, start

FORMATS = [("int4", 128), ("int8", 128), ("bf16", 0)]


def main():
    rows, copy_bw = start(__doc__)
    print(f"{'fmt':5s} {'shape':>12s} {'MB':>7s} {'copy %':>7s} {'chained %':>9s}")
    for fmt, group in FORMATS:
        for batch, ctx, hq, hkv, hd, page in SHAPES:
            args, kw, nbytes = make(fmt, batch, ctx, hq, hkv, hd, page, group=group or 64)
            del args, kw
            torch.cuda.empty_cache()
            half = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
            dst = torch.empty_like(half)
            copy = lambda: dst.copy_(half)  # noqa: E731
            shape = f"b{batch} ctx{ctx}"
            res = {}
            for how, timer in (("events", device_time), ("chained", chained_time)):
                res[how] = 100 * nbytes / timer(copy) / copy_bw
                rows.add("size_ceiling", f"{fmt} group{group}", f"copy_{how}", shape, "pct_of_copy", res[how])
            print(f"{fmt:5s} {shape:>12s} {nbytes / 1e6:7.1f} {res['events']:7.1f} {res['chained']:9.1f}", flush=True)
            del half, dst
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
