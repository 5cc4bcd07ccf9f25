"""Gated delta rule benchmarks, one section per op (run all, or one with --only).

decode: state bytes moved (each request's fp32 [HV, V, K] state read and written once) over
kernel time, next to the device-to-device copy bandwidth measured in the same run (bytes read +
written, harness.copy_bandwidth). Providers, each on the same q/k/v/g/beta:
  aot / jit      aotc's public op on a pool in random slot order, in place (a serving engine's
                 pool: more slots than rows); the AOT binary (or its JIT fallback when not built),
                 and the same binary through Triton's JIT
  aot_dense      the public op with state_indices=None and final_state: row b's state read from
                 h0[b] and written to a new tensor (flash-linear-attention's work: h0 -> ht)
  aotc_compat_fla  aotc.compat.fla's fused_recurrent_gated_delta_rule on that h0 (what a caller of
                 fla's signature gets; with a copy of h0 where the op has no final_state)
  fla_fused_recurrent  flash-linear-attention's own, when `import fla` works (h0 [N, HV, K, V], or
                 [N, HV, V, K] with state_v_first=True for V-major)
q/k/v/g/beta bytes (under 0.5% of the state's here) are not counted.

--ab DIR: only the decode kernel of this tree against DIR's (another checkout) and fla's, V-major, through
the JIT, in rounds (base, this tree, fla): for margins under 1%.

--sweep: the decode kernel at other tiles, forms and register caps on fla's work, JIT-compiled from
the same source and timed the same way, beside fla's, for choosing spec.block_v / spec.k_split /
spec.max_registers / spec.LONG_FROM; --sweep-only runs just that, at --sweep-t, in --reps rounds.

Timing (harness.device_time): CUDA events around each call, the L2 emptied before every call;
beside it the call's kernels summed by torch.profiler (harness.kernel_time, L2 warm).
Rows: JSON lines at --out, one per (op, variant, provider, shape, metric).
A later section (e.g. prefill) is a function `section(rows, copy_bw, args)` added to SECTIONS.
"""
from __future__ import annotations

import argparse
import inspect
import sys
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
    (256, 2, 16, 32, 128, 128),
    (256, 8, 16, 32, 128, 128),
]
# --sweep, GDN gate, per layout: (constexpr overrides of the call's own binary, num_warps, maxnreg; 0: none),
# on fla's work (dense h0 -> ht) at B 256 x T in --sweep-t: the "any" and the "long" token loop of each layout
# (V-major: packed rows in one part a thread at cap 72, or two (KS 2) at 80; K-major: cap 80 or 72), for
# choosing spec.LONG_FROM; V-major also the "any" loop at cap 64 and the token count fixed at compile time
# (NT "T": the call's T; no loop at T = 2) at 64 and 72, both spill-free on sm90, bf16 (32 programs an SM
# at 64 where 28).
SWEEP_T = tuple(range(2, 9))
SWEEP = {"vmajor": [({"KS": 1}, 1, 72), ({"KS": 2}, 1, 80), ({"KS": 1}, 1, 64), ({"KS": 1, "NT": "T"}, 1, 64),
                    ({"KS": 1, "NT": "T"}, 1, 72)],
         "kmajor": [({"BV": 8, "PER_K": 0}, 1, 80), ({"BV": 8, "PER_K": 0}, 1, 72)]}
# the op's dense form and final_state (older trees: none; their rows are left out)
DENSE = "final_state" in inspect.signature(loader.gated_delta_decode).parameters


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


def fla_decode(args, layout, module=None):
    """A call of fla's fused_recurrent_gated_delta_rule (or `module`'s, same signature) on the same
    inputs and a dense state of its own in the pool's layout (state_v_first=True for V-major), or
    (None, why)."""
    try:
        if module is None:
            from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as entry
        else:
            entry = module.fused_recurrent_gated_delta_rule
    except Exception as e:  # noqa: BLE001 - any import failure means: not measurable here
        return None, f"fla not importable ({type(e).__name__}: {str(e)[:80]})"
    q, k, v, g, beta, state, idx = args
    h0 = state[idx.long()]  # fla 0.6 reads [N, HV, K, V], or [N, HV, V, K] with state_v_first: the pool's layout

    def fn():
        return entry(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                     state_v_first=layout == "vmajor")
    try:
        fn()
        return fn, ""
    except Exception as e:  # noqa: BLE001
        return None, f"fla call failed ({type(e).__name__}: {str(e)[:100]})"


def dense_decode(args, kw, out):
    """The public op in fla's form: h0 = the pool's rows in request order, state_indices=None,
    the updated states to final_state."""
    q, k, v, g, beta, state, idx = args
    h0 = state[idx.long()]
    ht = torch.empty_like(h0)
    return lambda: loader.gated_delta_decode(q, k, v, g, beta, h0, None, **kw, out=out, final_state=ht,
                                             validate=False)


def bench_decode(rows, copy_bw, a):
    from aotc.compat import fla as compat_fla

    print("\n== gated_delta_decode (bf16 q/k/v, fp32 state, GDN gate; % of copy = 2 x state bytes / time / copy; "
          "kernel us: summed, L2 warm) ==")
    cols = ("aot", "jit", "aot_dense", "compat", "fla")
    print(f"{'layout':7s} {'gate':6s} {'B':>4s} {'T':>2s} " + " ".join(f"{c + ' %':>9s}" for c in cols)
          + " " + " ".join(f"{c + ' us':>9s}" for c in ("aot", "aot_dense", "compat", "fla")))
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
                aot = lambda: loader.gated_delta_decode(*args, **kw, out=out, validate=False)  # noqa: E731
                calls = {provider: aot}
                times = {provider: device_time(aot)}
                loader.set_artifacts(empty)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    times["jit"] = device_time(aot)
                loader.set_artifacts(None)
                if DENSE:
                    calls["aot_dense"] = dense_decode(args, kw, out)
                if not fused:
                    for prov, module in (("aotc_compat_fla", compat_fla), ("fla_fused_recurrent", None)):
                        fn, why = fla_decode(args, layout, module)
                        if why:
                            notes.add(why)
                        if fn:
                            calls[prov] = fn
                for prov, fn in calls.items():
                    if prov not in times:
                        times[prov] = device_time(fn)
                ktimes = {prov: kernel_time(fn) for prov, fn in calls.items()}  # fla's events can hold its host time
                gate = "fused" if fused else "gdn"
                variant = f"bf16,k{K},{layout},{gate}"
                shape = f"B{B} T{T} H{H} HV{HV} K{K} V{V}"
                for prov, t in times.items():
                    rows.add("gated_delta_decode", variant, prov, shape, "us", t * 1e6)
                    rows.add("gated_delta_decode", variant, prov, shape, "GBps", nbytes / t / 1e9)
                    rows.add("gated_delta_decode", variant, prov, shape, "pct_of_copy", 100 * nbytes / t / copy_bw)
                for prov, t in ktimes.items():
                    rows.add("gated_delta_decode", variant, prov, shape, "kernel_us", t * 1e6)
                pct = {c: 100 * nbytes / t / copy_bw for c, t in times.items()}
                names = {"aot": provider, "compat": "aotc_compat_fla", "fla": "fla_fused_recurrent"}
                print(f"{layout:7s} {gate:6s} {B:4d} {T:2d} "
                      + " ".join(f"{pct.get(names.get(c, c), float('nan')):8.1f}%" for c in cols) + " "
                      + " ".join(f"{ktimes.get(names.get(c, c), float('nan')) * 1e6:9.1f}"
                                 for c in ("aot", "aot_dense", "compat", "fla"))
                      + (f"  [{provider}]" if provider != "aot" else ""))
                del args, kw, out, calls
                torch.cuda.empty_cache()
    for why in sorted(notes):
        print(f"note: {why}; its columns are NaN (issue 19's H100 figures for fla 0.6.0: 97.7% V-first, 81% K-first)")
    if a.sweep:
        sweep_decode(rows, copy_bw, tuple(int(t) for t in a.sweep_t.split(",")))


def sweep_decode(rows, copy_bw, sweep_t=SWEEP_T, layouts=gd_spec.LAYOUTS, reps=1):
    """The decode kernel (GDN gate) at other tiles, forms and register caps, through the JIT, on fla's
    work (the op's dense call: state_indices None, final_state), its own binary's constexprs overridden,
    and fla's kernel on the same inputs, in `reps` rounds of every form (margins under 1%)."""
    for T in sweep_t:
        B, _, H, HV, K, V = DECODE_SHAPES[0]
        nbytes = 2 * B * HV * V * K * 4
        shape = f"B{B} T{T} H{H} HV{HV} K{K} V{V}"
        print(f"\n-- sweep: {shape}, GDN, JIT, dense h0 -> ht: % of copy (L2 emptied), kernel us (L2 warm) --")
        for layout in layouts:
            args, kw = decode_inputs(B, T, H, HV, K, V, layout)
            q, k, v, g, beta, state, idx = args
            h0 = state[idx.long()]
            ht = torch.empty_like(h0)
            out = torch.empty(B, T, HV, V, device="cuda", dtype=torch.bfloat16)
            axes, _grid, kargs = gd_op.launch_plan(q, k, v, g, beta, h0, None, out, final_state=ht, **kw)
            cfg = gd_spec.launch(axes, 90)
            own = gd_spec.constexprs(axes)
            calls = {}
            for over, warps, cap in SWEEP[layout]:
                cx = dict(own, **{n: T if x == "T" else x for n, x in over.items()})
                grid = gd_spec.grid(B, HV, V, cx["BV"])

                def fn(cx=cx, grid=grid, warps=warps, cap=cap):
                    gated_delta_decode_kernel[grid](*kargs, **cx, num_warps=warps, num_stages=1,
                                                    **({"maxnreg": cap} if cap else {}))
                mine = cx == own and (warps, cap) == (cfg.num_warps, cfg.maxnreg) and axes["gate"] == "gdn"
                form = ",".join(f"{n}{cx[n]}" for n in ("BV", "PACKED", "NT", "PER_K", "KS") if n in cx)
                name = f"{form:24s} warps {warps} cap {cap:3d}" + ("  (spec default)" if mine else "")
                try:
                    fn()
                except Exception as e:  # noqa: BLE001 - a tile that does not compile is reported, not fatal
                    print(f"{layout:7s} {name}: failed ({type(e).__name__}: {str(e)[:80]})")
                    continue
                calls[name] = (fn, f"bf16,k{K},{layout},gdn,{form},w{warps},r{cap}", "jit_dense")
            fla, why = fla_decode(args, layout)
            if fla:
                calls[f"{'fla fused_recurrent':24s}"] = (fla, f"bf16,k{K},{layout},gdn,fla", "fla_fused_recurrent")
            else:
                print(f"note: {why}")
            for rep in range(reps):
                for name, (fn, variant, prov) in calls.items():
                    t, kt = device_time(fn, rep_ms=100), kernel_time(fn, iters=50)
                    pct = 100 * nbytes / t / copy_bw
                    print(f"{layout:7s} r{rep} {name}: {t * 1e6:8.1f} us {pct:6.1f}%  kernel {kt * 1e6:7.1f} us",
                          flush=True)
                    provider = prov if reps == 1 else f"{prov}_r{rep}"
                    rows.add("gated_delta_decode_sweep", variant, provider, shape, "pct_of_copy", pct)
                    rows.add("gated_delta_decode_sweep", variant, provider, shape, "kernel_us", kt * 1e6)
            del args, kw, q, k, v, g, beta, state, idx, h0, ht, out, kargs, calls
            torch.cuda.empty_cache()


# --ab: fla's work (dense h0 -> ht) and a pool, V-major GDN, the forms whose one-token and short loops
# are closest to fla's: (B, T, form)
AB_CASES = [(256, 1, "dense"), (64, 1, "dense"), (256, 2, "dense"), (256, 4, "dense"), (256, 8, "dense"),
            (256, 1, "pool"), (256, 2, "pool")]


def _named_for(kern, cx):
    """cx under `kern`'s constexpr names: a tree before NT calls the one-token flag ONE."""
    if "NT" in cx and "NT" not in kern.arg_names and "ONE" in kern.arg_names:
        cx = dict(cx)
        cx["ONE"] = cx.pop("NT")
    return cx


def ab_decode(rows, copy_bw, base: str, reps: int):
    """This tree's decode kernel against another checkout's (`base`: its kernels/gated_delta/recurrent.py,
    the same signature), both through the JIT with this tree's launch (variant, grid, cap), and on
    fla's work fla's own kernel, on the same inputs, in `reps` rounds of (base, this tree, fla):
    margins under 1% need them side by side and repeated."""
    import importlib.util

    loc = importlib.util.spec_from_file_location("base_recurrent", f"{base}/kernels/gated_delta/recurrent.py")
    mod = importlib.util.module_from_spec(loc)
    sys.modules[loc.name] = mod
    loc.loader.exec_module(mod)
    kernels = {"base": mod.gated_delta_decode_kernel, "tree": gated_delta_decode_kernel}
    _, _, H, HV, K, V = DECODE_SHAPES[0]
    print(f"\n-- ab: {base} (base) against this tree, V-major GDN, JIT; % of copy (L2 emptied), kernel us (L2 warm) --")
    for B, T, form in AB_CASES:
        nbytes = 2 * B * HV * V * K * 4
        shape = f"B{B} T{T} H{H} HV{HV} K{K} V{V}"
        args, kw = decode_inputs(B, T, H, HV, K, V, "vmajor")
        q, k, v, g, beta, state, idx = args
        out = torch.empty(B, T, HV, V, device="cuda", dtype=torch.bfloat16)
        if form == "dense":
            h0 = state[idx.long()]
            plan = gd_op.launch_plan(q, k, v, g, beta, h0, None, out, final_state=torch.empty_like(h0), **kw)
        else:
            plan = gd_op.launch_plan(q, k, v, g, beta, state, idx, out, **kw)
        axes, grid, kargs = plan
        cfg, cx = gd_spec.launch(axes, 90), gd_spec.constexprs(axes)
        opts = dict(num_warps=cfg.num_warps, num_stages=1, **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}))
        calls = {name: (lambda kern=kern: kern[grid](*kargs, **_named_for(kern, cx), **opts))
                 for name, kern in kernels.items()}
        if form == "dense":
            fn, why = fla_decode(args, "vmajor")
            if fn:
                calls["fla"] = fn
            else:
                print(f"note: {why}")
        variant = f"bf16,k{K},vmajor,gdn,{form},{axes['rows']},{axes['tokens']}"
        for rep in range(reps):
            line = []
            for name, fn in calls.items():
                t, kt = device_time(fn, rep_ms=100), kernel_time(fn, iters=50)
                pct = 100 * nbytes / t / copy_bw
                rows.add("gated_delta_decode_ab", variant, f"{name}_r{rep}", shape, "pct_of_copy", pct)
                rows.add("gated_delta_decode_ab", variant, f"{name}_r{rep}", shape, "kernel_us", kt * 1e6)
                line.append(f"{name} {pct:5.1f}% {kt * 1e6:7.1f} us")
            print(f"{form:5s} {B:4d} x {T} r{rep}: " + " | ".join(line), flush=True)
        del args, kw, out, plan, kargs, calls
        torch.cuda.empty_cache()


SECTIONS = {"decode": bench_decode}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="append result rows (JSON lines) to this file")
    ap.add_argument("--only", choices=sorted(SECTIONS), default=None, help="run one section")
    ap.add_argument("--sweep", action="store_true", help="decode: also time other tiles through the JIT")
    ap.add_argument("--ab", metavar="DIR", default=None,
                    help="only time this tree's decode kernel against DIR's (another checkout), and fla's")
    ap.add_argument("--reps", type=int, default=3, help="--ab and --sweep-only: rounds")
    ap.add_argument("--sweep-only", action="store_true", help="only the decode sweep (--sweep-t, --layout, --reps)")
    ap.add_argument("--sweep-t", default=",".join(map(str, SWEEP_T)), help="--sweep: token counts, e.g. 2,3,4")
    ap.add_argument("--layout", choices=gd_spec.LAYOUTS, default=None, help="--sweep-only: one layout")
    a = ap.parse_args()
    rows = Rows(a.out)
    copy_bw = copy_bandwidth()
    rows.add("copy", "-", "torch_copy", "2GiB", "GBps", copy_bw / 1e9)
    print(f"device-to-device copy: {copy_bw / 1e9:.0f} GB/s (read + write)")
    if a.ab:
        ab_decode(rows, copy_bw, a.ab, a.reps)
        return
    if a.sweep_only:
        sweep_decode(rows, copy_bw, tuple(int(t) for t in a.sweep_t.split(",")),
                     (a.layout,) if a.layout else gd_spec.LAYOUTS, a.reps)
        return
    for name, section in SECTIONS.items():
        if a.only in (None, name):
            section(rows, copy_bw, a)


if __name__ == "__main__":
    main()
