"""What launching the split kernel as a programmatic dependent launch (PDL) saves: the same
decode call (split + merge, Triton JIT launches of one binary pair) with the split launched
plainly (PDL=0: the merge grid is scheduled only after the split grid completes) and as a
dependent launch that lets the merge grid in early (PDL=1, kernel.py), next to the aotc call
and the split kernel alone, % of the copy bandwidth measured in the same run.

Two timings: `events` (harness.device_time: an event pair around each call, the L2 emptied by a
read before it) and `chained` (a loop of flush + call with no event between them, minus a loop
of flushes alone: the split may then also start under the flush kernel's tail, as it would
under the kernel before it in a serving step)."""
from __future__ import annotations

import argparse

import torch

from aotc import loader
from aotc.loader.fallback import jit_function
from bench_decode import make
from harness import Rows, chained_time, copy_bandwidth, device_time
from launch_overhead import capture_launches

CASES = [("bf16", 0), ("int8", 128), ("int8", 64), ("int4", 128), ("int4", 64)]
SHAPES = [(32, 4096, 32, 8, 128, 16), (64, 4096, 32, 8, 128, 16), (32, 8192, 32, 8, 128, 16),
          (1, 32768, 32, 8, 128, 16), (4, 4096, 32, 8, 128, 16)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--kernels", default="", help="kernel.py copies whose split kernel also runs as PDL=1")
    ap.add_argument("--cases", default="", help="indices into CASES")
    ap.add_argument("--shapes", default="", help="indices into SHAPES")
    a = ap.parse_args()
    from sweep_decode import load_kernel
    copies = [(p.rsplit("/", 1)[-1], load_kernel(p)) for p in a.kernels.split(",") if p]
    cases = [CASES[int(i)] for i in a.cases.split(",")] if a.cases else CASES
    shapes = [SHAPES[int(i)] for i in a.shapes.split(",")] if a.shapes else SHAPES
    rows = Rows(a.out)
    copy_bw = copy_bandwidth()
    print(f"copy {copy_bw / 1e9:.0f} GB/s; % of copy: aot | split PDL=0 + merge | split PDL=1 + merge | split alone; "
          f"then chained: PDL=0 | PDL=1 | aot")
    for fmt, group in cases:
        for batch, ctx, hq, hkv, hd, page in shapes:
            args, kw, nbytes = make(fmt, batch, ctx, hq, hkv, hd, page, group=group or 64)
            out = torch.empty_like(args[0])
            aot = lambda: loader.decode(*args, **kw, out=out, validate=False)  # noqa: E731
            aot()
            want = out.clone()
            (sspec, saxes, sgrid, sargs), (mspec, maxes, mgrid, margs) = capture_launches(aot)
            split, merge = jit_function(sspec), jit_function(mspec)
            mopts = dict(mspec.compile_constexprs(maxes, 90), **mspec.launch(maxes, 90).triton_options())
            cfg = sspec.launch(saxes, 90).triton_options()
            plain = dict(sspec.compile_constexprs(saxes, 90), PDL=0, **{k: v for k, v in cfg.items() if k != "launch_pdl"})
            dep = dict(sspec.compile_constexprs(saxes, 90), **cfg)
            calls = {
                "split_plain+merge": lambda: (split[sgrid](*sargs, **plain), merge[mgrid](*margs, **mopts)),
                "split_pdl+merge": lambda: (split[sgrid](*sargs, **dep), merge[mgrid](*margs, **mopts)),
            }
            for name, k in copies:
                calls[name] = (lambda k: lambda: (k[sgrid](*sargs, **dep), merge[mgrid](*margs, **mopts)))(k)
            for name, f in calls.items():
                out.zero_()
                f()
                torch.cuda.synchronize()
                if not torch.equal(out, want):
                    raise SystemExit(f"{fmt} {group} b{batch}: {name} differs from the aot call")
            pct = lambda t: 100 * nbytes / t / copy_bw  # noqa: E731
            ev = {"aot": device_time(aot), **{n: device_time(f) for n, f in calls.items()},
                  "split_alone": device_time(lambda: split[sgrid](*sargs, **dep))}
            ch = {**{n: chained_time(f) for n, f in calls.items()}, "aot": chained_time(aot)}
            shape = f"b{batch} ctx{ctx} h{hq}/{hkv} d{hd} page{page}"
            variant = f"{fmt} group{group}" if group else fmt
            print(f"{variant:12s} {shape:28s} events " + " ".join(f"{pct(t):5.1f}" for t in ev.values())
                  + "  chained " + " ".join(f"{pct(t):5.1f}" for t in ch.values())
                  + f"  (us: {ev['split_plain+merge'] * 1e6:.1f} -> {ev['split_pdl+merge'] * 1e6:.1f}; chained "
                  f"{ch['split_plain+merge'] * 1e6:.1f} -> {ch['split_pdl+merge'] * 1e6:.1f})", flush=True)
            for n, t in ev.items():
                rows.add("decode_pdl", variant, n, shape, "pct_of_copy", pct(t))
                rows.add("decode_pdl", variant, n, shape, "us", t * 1e6)
            for n, t in ch.items():
                rows.add("decode_pdl", variant, f"chained_{n}", shape, "us", t * 1e6)
            del args, kw, out
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
