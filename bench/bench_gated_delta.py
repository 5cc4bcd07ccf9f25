"""Gated delta rule benchmarks, one section per op (run all, or one with --only).

decode: state bytes moved (each request's fp32 [HV, V, K] state read and written once) over
kernel time, next to the device-to-device copy bandwidth measured in the same run (bytes read +
written, harness.copy_bandwidth): aotc's public op (AOT binary, or its JIT fallback when not
built), the same kernel through Triton's JIT, and flash-linear-attention's
fused_recurrent_gated_delta_rule when `import fla` works (its own [N, HV, K, V] initial/final
state, no pool: the same state bytes). Both pool layouts; the pool holds more slots than rows and
rows name a random subset of them, as a serving engine's pool does. q/k/v/g/beta bytes (under
0.5% of the state's here) are not counted.

--sweep: the decode kernel's tile (BV value rows x num_warps) over a small grid, JIT-compiled from
the same source and timed the same way, for choosing spec.block_v / spec.launch.

Timing (harness.device_time): CUDA events around each call, the L2 emptied before every call.
Rows: JSON lines at --out, one per (op, variant, provider, shape, metric).
A later section (e.g. prefill) is a function `section(rows, copy_bw, args)` added to SECTIONS.
"""
from __future__ import annotations

import argparse
import tempfile
import warnings

import torch

from aotc import loader
from aotc.kernels.gated_delta import spec as gd_spec
from aotc.kernels.gated_delta.recurrent import gated_delta_decode_kernel
from aotc.loader.ops import gated_delta as gd_op
from harness import Rows, copy_bandwidth, device_time, kernel_time

DECODE_SHAPES = [  # (B, T, H, HV, K, V)
    (256, 1, 16, 32, 128, 128),
    (64, 1, 16, 32, 128, 128),
    (256, 4, 16, 32, 128, 128),
]
# (BV, num_warps, maxnreg; 0: none) tried by --sweep for the GDN gate, per layout, at B 256 x T 1 and 4.
SWEEP = {"vmajor": [(8, 1, 0), (8, 1, 64), (8, 1, 72), (16, 2, 0)],
         "kmajor": [(8, 1, 0), (8, 1, 72), (8, 1, 80), (32, 4, 0)]}


def decode_inputs(B, T, H, HV, K, V, layout, fused=False):
    dev = "cuda"
    q = torch.randn(B, T, H, K, device=dev, dtype=torch.bfloat16)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(torch.bfloat16)
    v = torch.randn(B, T, HV, V, device=dev, dtype=torch.bfloat16)
    slots = B + B // 4 + 1
    state = torch.randn(slots, HV, *((V, K) if layout == "vmajor" else (K, V)), device=dev) * 0.5
    idx = torch.randperm(slots, device=dev)[:B].to(torch.int32)
    A_log = torch.log(torch.rand(HV, device=dev) * 15 + 1)
    a = torch.randn(B, T, HV, device=dev, dtype=torch.bfloat16)
    dt_bias = torch.randn(HV, device=dev)
    b = torch.randn(B, T, HV, device=dev, dtype=torch.bfloat16)
    if fused:
        return (q, k, v, None, None, state, idx), dict(state_layout=layout, A_log=A_log, a=a, dt_bias=dt_bias, b=b)
    g = -torch.exp(A_log) * torch.nn.functional.softplus(a.float() + dt_bias)
    return (q, k, v, g, torch.sigmoid(b.float()), state, idx), dict(state_layout=layout)


def fla_decode(args, layout):
    """A call of fla's fused_recurrent_gated_delta_rule on the same inputs and a state of its own in the
    pool's layout (state_v_first=True for V-major), or (None, why)."""
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except Exception as e:  # noqa: BLE001 - any import failure means: not measurable here
        return None, f"fla not importable ({type(e).__name__}: {str(e)[:80]})"
    q, k, v, g, beta, state, idx = args
    h0 = state[idx.long()]  # fla 0.6 reads [N, HV, K, V], or [N, HV, V, K] with state_v_first: the pool's layout

    def fn():
        return fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                                                state_v_first=layout == "vmajor")
    try:
        fn()
        return fn, ""
    except Exception as e:  # noqa: BLE001
        return None, f"fla call failed ({type(e).__name__}: {str(e)[:100]})"


def bench_decode(rows, copy_bw, a):
    print("\n== gated_delta_decode (bf16 q/k/v, fp32 state, GDN gate; state GB/s = 2 x state bytes / time) ==")
    print(f"{'layout':7s} {'gate':6s} {'B':>4s} {'T':>2s} {'HV':>3s} {'K':>4s} {'aot us':>8s} {'aot GB/s':>9s} "
          f"{'% copy':>7s} {'jit us':>8s} {'jit % copy':>10s} {'fla us':>8s} {'fla % copy':>10s} {'aot kern':>8s} "
          f"{'fla kern':>8s}")
    empty = tempfile.mkdtemp()
    notes = set()
    for B, T, H, HV, K, V in DECODE_SHAPES:
        for layout in gd_spec.LAYOUTS:
            for fused in (False, True):
                if fused and (B, T) != (256, 1):
                    continue
                args, kw = decode_inputs(B, T, H, HV, K, V, layout, fused)
                nbytes = 2 * B * HV * V * K * 4
                out = torch.empty(B, T, HV, V, device="cuda", dtype=torch.bfloat16)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    loader.gated_delta_decode(*args, **kw, out=out, validate=False)
                provider = "aot_jit_fallback" if any("not built" in str(w.message) for w in caught) else "aot"
                t_aot = device_time(lambda: loader.gated_delta_decode(*args, **kw, out=out, validate=False))
                loader.set_artifacts(empty)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    t_jit = device_time(lambda: loader.gated_delta_decode(*args, **kw, out=out, validate=False))
                loader.set_artifacts(None)
                fn, why = fla_decode(args, layout) if not fused else (None, "")
                if why:
                    notes.add(why)
                t_fla = device_time(fn) if fn else float("nan")
                # summed kernel durations too (fla's events can hold its host time)
                k_aot = kernel_time(lambda: loader.gated_delta_decode(*args, **kw, out=out, validate=False))
                k_fla = kernel_time(fn) if fn else float("nan")
                gate = "fused" if fused else "gdn"
                variant = f"bf16,k{K},{layout},{gate}"
                shape = f"B{B} T{T} H{H} HV{HV} K{K} V{V}"
                for prov, t in ((provider, t_aot), ("jit", t_jit), ("fla_fused_recurrent", t_fla)):
                    if t == t:
                        rows.add("gated_delta_decode", variant, prov, shape, "us", t * 1e6)
                        rows.add("gated_delta_decode", variant, prov, shape, "GBps", nbytes / t / 1e9)
                        rows.add("gated_delta_decode", variant, prov, shape, "pct_of_copy", 100 * nbytes / t / copy_bw)
                for prov, t in ((provider, k_aot), ("fla_fused_recurrent", k_fla)):
                    if t == t:
                        rows.add("gated_delta_decode", variant, prov, shape, "kernel_us", t * 1e6)
                pct = lambda t: 100 * nbytes / t / copy_bw  # noqa: E731
                print(f"{layout:7s} {gate:6s} {B:4d} {T:2d} {HV:3d} {K:4d} {t_aot * 1e6:8.1f} "
                      f"{nbytes / t_aot / 1e9:9.0f} "
                      f"{pct(t_aot):6.1f}% {t_jit * 1e6:8.1f} {pct(t_jit):9.1f}% {t_fla * 1e6:8.1f} {pct(t_fla):9.1f}%"
                      f" {k_aot * 1e6:8.1f} {k_fla * 1e6:8.1f}"
                      + (f"  [{provider}]" if provider != "aot" else ""))
                del args, kw, out
                torch.cuda.empty_cache()
    for why in sorted(notes):
        print(f"note: {why}; fla columns are NaN (issue 19's H100 figures for fla 0.6.0: 97.7% V-first, 81% K-first)")
    if a.sweep:
        sweep_decode(rows, copy_bw)


def sweep_decode(rows, copy_bw):
    """The decode kernel (GDN gate) at other tiles and register caps, through the JIT, at B 256 x T 1 and 4."""
    for B, T, H, HV, K, V in (DECODE_SHAPES[0], DECODE_SHAPES[2]):
        nbytes = 2 * B * HV * V * K * 4
        print(f"\n-- sweep: B{B} T{T} H{H} HV{HV} K{K} V{V}, GDN, JIT, % of copy --")
        for layout in gd_spec.LAYOUTS:
            args, kw = decode_inputs(B, T, H, HV, K, V, layout)
            out = torch.empty(B, T, HV, V, device="cuda", dtype=torch.bfloat16)
            axes, _grid, kargs = gd_op.launch_plan(*args, out, **kw)
            cfg = gd_spec.launch(axes, 90)
            default = (gd_spec.constexprs(axes)["BV"], cfg.num_warps, cfg.maxnreg) if axes["gate"] == "gdn" else None
            for bv, warps, cap in SWEEP[layout]:
                grid = gd_spec.grid(B, HV, V, bv)

                def fn():
                    gated_delta_decode_kernel[grid](*kargs, BK=gd_spec.block_k(K), BV=bv,
                                                    KMAJOR=int(layout == "kmajor"), PER_K=0, num_warps=warps,
                                                    num_stages=1,
                                                    **({"maxnreg": cap} if cap else {}))
                try:
                    t = device_time(fn)
                except Exception as e:  # noqa: BLE001 - a tile that does not compile is reported, not fatal
                    print(f"{layout:7s} BV {bv:3d} warps {warps} cap {cap}: failed ({type(e).__name__}: {str(e)[:80]})")
                    continue
                mark = "  (spec default)" if (bv, warps, cap) == default else ""
                print(f"{layout:7s} BV {bv:3d} warps {warps} cap {cap:3d}: {t * 1e6:8.1f} us "
                      f"{100 * nbytes / t / copy_bw:6.1f}%{mark}")
                rows.add("gated_delta_decode_sweep", f"bf16,k{K},{layout},gdn,BV{bv},w{warps},r{cap}", "jit",
                         f"B{B} T{T} H{H} HV{HV} K{K} V{V}", "pct_of_copy", 100 * nbytes / t / copy_bw)
            del args, kw, out, kargs
            torch.cuda.empty_cache()


SECTIONS = {"decode": bench_decode}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="append result rows (JSON lines) to this file")
    ap.add_argument("--only", choices=sorted(SECTIONS), default=None, help="run one section")
    ap.add_argument("--sweep", action="store_true", help="decode: also time other tiles through the JIT")
    a = ap.parse_args()
    rows = Rows(a.out)
    copy_bw = copy_bandwidth()
    rows.add("copy", "-", "torch_copy", "2GiB", "GBps", copy_bw / 1e9)
    print(f"device-to-device copy: {copy_bw / 1e9:.0f} GB/s (read + write)")
    for name, section in SECTIONS.items():
        if a.only in (None, name):
            section(rows, copy_bw, a)


if __name__ == "__main__":
    main()
