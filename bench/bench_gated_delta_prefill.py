"""Chunked gated delta rule prefill (loader.gated_delta_prefill) side by side with flash-linear-attention
0.6.0's chunk_gated_delta_rule and chunk_kda in one run, by summed kernel durations (torch.profiler).

Shapes per issue 38: B 1 x T 8192, B 8 x T 2048 (packed, varlen), B 1 x T 32768 and B 1 x T 65536;
H = 16 q/k heads, HV = 32 value heads (GVA on both sides: fla 0.6 takes HV > H itself), K = V = 128,
bf16, GDN gates from SGLang's form (KDA: one a K channel), beta = sigmoid, L2 norm of q and k in
the kernel, fp32 initial and final states. aotc with a V-major and a K-major pool; fla with its
K-major state and with state_v_first=True (V-major), each against aotc's pool of the same layout.
fla autotunes: each of its calls is warmed before timing, and the configs its autotuners chose
are printed and kept as rows (metric "config"), also when a time limit's SIGTERM ends the run. Time = kernel_time (the sum of one call's kernel
durations, L2 warm, host time left out: fla's host side can outlast its kernels at 1 x 8192);
aotc's V-major call is also timed by CUDA events with the L2 emptied (device_time), beside a
bandwidth floor (q, k, v, g, beta read once, out written once, states read and written once, at
the device-to-device copy bandwidth of the same run). Rows: JSON lines at --out.

On sm90 the op's state pass is the warp-specialized Gluon kernel (state_ws_spec), and the variant
string says so (",gluon_state"); AOTC_GDN_STATE_WS=0 times the Triton state pass (",triton_state").
--kernels: also each call's time split by kernel (aotc V-major, fla state_v_first), for seeing which
pass dominates. --no-fla: aotc alone (a second checkout timed in the same device call).
--prep-sweep W:S:R,...: the precompute kernels alone at 1 x 8192 (GDN's one, KDA's three) under
these num_warps, num_stages and maxnreg (0: none), JIT, with their registers and spills.

--sweep: GDN's two kernels at 1 x 8192 under other num_warps /
num_stages (and BV for the state pass), JIT-compiled from the same source and timed the same way,
for choosing chunk_spec.prep_launch / state_launch / state_block_v.
"""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import warnings

import torch
import torch.nn.functional as F

from aotc.kernels.gated_delta import chunk as chunk_kernels
from aotc.kernels.gated_delta import chunk_spec, state_ws_spec
from aotc.loader.dispatch import run_kernel
from aotc.loader.fallback import AotcJitFallbackWarning
from aotc.loader.ops import gated_delta_prefill as op
from harness import Rows, copy_bandwidth, device_time, kernel_time, kernel_times

H, HV, K, V = 16, 32, 128, 128
DTYPE = torch.bfloat16
SHAPES = [("1x8192", [8192]), ("8x2048", [2048] * 8), ("1x32768", [32768]), ("1x65536", [65536])]


def make(lengths, kda, layout):
    T, N = sum(lengths), len(lengths)
    dev = "cuda"
    q = torch.randn(1, T, H, K, device=dev, dtype=DTYPE)
    k = torch.randn(1, T, H, K, device=dev, dtype=DTYPE)
    v = torch.randn(1, T, HV, V, device=dev, dtype=DTYPE)
    a_log = torch.log(torch.rand(HV, device=dev) * 15 + 1)
    gshape = (1, T, HV, K) if kda else (1, T, HV)
    decay = a_log.exp().view(-1, 1) if kda else a_log.exp()
    g = -decay * F.softplus(torch.randn(gshape, device=dev) - 2)
    beta = torch.sigmoid(torch.randn(1, T, HV, device=dev))
    inner = (V, K) if layout == "vmajor" else (K, V)
    state = torch.randn(N, HV, *inner, device=dev) * 0.1
    idx = torch.arange(N, device=dev, dtype=torch.int32)
    cu = torch.tensor([0] + lengths, device=dev).cumsum(0).to(torch.int32)
    return q, k, v, g, beta, state, idx, cu


def floor_bytes(lengths, kda) -> int:
    T, N = sum(lengths), len(lengths)
    qkv = 2 * T * H * K * 2 + T * HV * V * 2
    gates = T * HV * (K if kda else 1) * 4 + T * HV * 4
    return qkv + gates + T * HV * V * 2 + 2 * N * HV * V * K * 4


def fla_call(q, k, v, g, beta, lengths, kda, v_first):
    """fla's chunk_gated_delta_rule / chunk_kda on the same inputs (its own initial state, K-major or
    with state_v_first V-major), warmed (autotuned), or (None, why)."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        from fla.ops.kda import chunk_kda
    except Exception as e:  # noqa: BLE001 - any import failure means "not available here"
        return None, f"fla not importable ({type(e).__name__}: {str(e)[:80]})"
    N = len(lengths)
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).long()
    h0 = torch.randn(N, HV, *((V, K) if v_first else (K, V)), device="cuda") * 0.1
    op_fn = chunk_kda if kda else chunk_gated_delta_rule

    def fn():
        with torch.inference_mode():
            return op_fn(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                         use_qk_l2norm_in_kernel=True, state_v_first=v_first)
    try:
        for _ in range(3):  # the first call autotunes
            fn()
        torch.cuda.synchronize()
        return fn, ""
    except Exception as e:  # noqa: BLE001
        return None, f"fla call failed ({type(e).__name__}: {str(e)[:120]})"


def kernel_split(fn, iters: int = 20) -> dict:
    """{kernel name: mean device ms a call} of one call's kernels (torch.profiler, L2 warm)."""
    return {name: sec * 1e3 for name, sec in kernel_times(fn, iters).items()}


def print_split(rows, who, shape, variant, split):
    for name, ms in sorted(split.items(), key=lambda kv: -kv[1]):
        print(f"  {who:5s} {ms:8.3f} ms  {name[:90]}")
        rows.add("gated_delta_prefill_kernel", variant, who + ":" + name[:120], shape, "ms", ms)


def fla_configs() -> dict:
    """{kernel: {autotune key: chosen config}} of every fla autotuner that has chosen one."""
    import sys

    from triton.runtime.autotuner import Autotuner

    found, seen = {}, set()
    for mod_name, mod in list(sys.modules.items()):
        if not mod_name.startswith("fla.ops"):
            continue
        for name, obj in vars(mod).items():
            for _ in range(8):  # most of fla's autotuners sit inside a triton.heuristics wrapper (.fn)
                if obj is None or isinstance(obj, Autotuner):
                    break
                obj = getattr(obj, "fn", None)
            if isinstance(obj, Autotuner) and obj.cache and id(obj) not in seen:
                seen.add(id(obj))
                found[f"{mod_name}.{name}"] = {str(key): str(cfg) for key, cfg in obj.cache.items()}
    return found


# (num_warps, num_stages) tried by --sweep; the state pass also at BV 64 and 128 (fewer programs).
# No BV 32 at one stage: at K = V = 128 it hit an illegal memory access on the H100 (Triton 3.6),
# which ends the process's CUDA context (chunk_spec.state_launch).
PREP_SWEEP = [(2, 1, 0), (4, 1, 0), (4, 1, 128), (4, 1, 168), (8, 1, 0), (16, 1, 0)]  # + maxnreg (0: none)
STATE_SWEEP = [(32, 4, 2), (32, 4, 3), (32, 8, 2), (64, 4, 1), (64, 4, 2), (64, 8, 2), (128, 8, 1), (128, 8, 2),
               (128, 16, 2)]


def sweep(rows):
    """GDN's two kernels at 1 x 8192 (V-major) under other launch choices, JIT (KDA's precompute
    kernels: --prep-sweep)."""
    print("\n-- sweep: 1x8192, JIT, bf16, K = V = 128, V-major pool --")
    for kda in (False,):
        q, k, v, g, beta, state, idx, cu = make([8192], kda, "vmajor")
        out = torch.empty_like(v)
        (pspec, paxes, pgrid, pargs), (sspec, saxes, _sgrid, sargs) = op.launch_plan(
            q, k, v, g, beta, state, idx, cu, out, K ** -0.5, True, "vmajor")
        gate = "kda" if kda else "gdn"
        default = chunk_spec.prep_launch(paxes, 90)
        for warps, stages, cap in PREP_SWEEP:
            def prep():
                chunk_kernels.gdn_chunk_prep[pgrid](*pargs, **pspec.compile_constexprs(paxes, 90), num_warps=warps,
                                                    num_stages=stages, **({"maxnreg": cap} if cap else {}))
            _sweep_row(rows, f"prep {gate} warps {warps:2d} stages {stages} maxnreg {cap:3d}", prep,
                       (warps, stages, cap) == (default.num_warps, default.num_stages, default.maxnreg),
                       f"bf16,k{K},v{V},{gate},w{warps},s{stages}" + (f",r{cap}" if cap else ""),
                       "gated_delta_prefill_prep_sweep")
        if not kda:
            run_kernel(pspec, paxes, pgrid, pargs)  # the state pass reads the workspace the precompute wrote
            default = chunk_spec.state_launch(saxes, 90)
            for bv, warps, stages in STATE_SWEEP:
                def st():
                    chunk_kernels.gdn_chunk_state[(idx.shape[0], HV, V // bv)](
                        *sargs, HEAD_K=K, HEAD_V=V, BV=bv, TF32=1, num_warps=warps, num_stages=stages)
                _sweep_row(rows, f"state BV {bv:2d} warps {warps} stages {stages}", st,
                           (bv, warps, stages) == (saxes["bv"], default.num_warps, default.num_stages),
                           f"bf16,k{K},v{V},BV{bv},w{warps},s{stages}", "gated_delta_prefill_state_sweep")
        del q, k, v, g, beta, state, out, pargs, sargs
        torch.cuda.empty_cache()


def _sweep_row(rows, label, fn, is_default, variant, op_name):
    try:
        t = device_time(fn)
    except Exception as e:  # noqa: BLE001 - a choice that does not compile or launch is reported, not fatal
        print(f"{label}: failed ({type(e).__name__}: {str(e)[:100]})")
        return
    print(f"{label}: {t * 1e3:8.3f} ms" + ("  (spec default)" if is_default else ""))
    rows.add(op_name, variant, "jit", "1x8192 h16/32", "ms", t * 1e3)


def prep_sweep(rows, configs, gates=("gdn", "kda")):
    """The precompute kernels alone at 1 x 8192 (V-major; the gates asked for) under other launch
    choices, JIT; each kernel in launch order (KDA: kda_chunk_intra, kda_chunk_inter, kda_chunk_wy,
    each reading what the one before wrote)."""
    print("\n-- precompute sweep: 1x8192, JIT, bf16, K = V = 128 --")
    for kda in [g == "kda" for g in gates]:
        q, k, v, g, beta, state, idx, cu = make([8192], kda, "vmajor")
        out = torch.empty_like(v)
        *pre, _st = op.launch_plan(q, k, v, g, beta, state, idx, cu, out, K ** -0.5, True, "vmajor")
        gate = "kda" if kda else "gdn"
        for pspec, paxes, pgrid, pargs in pre:
            default = pspec.launch_config(paxes, 90)
            consts = pspec.compile_constexprs(paxes, 90)
            fn = getattr(importlib.import_module(pspec.module), pspec.function)
            for warps, stages, cap in configs:
                def prep():
                    return fn[pgrid](*pargs, **consts, num_warps=warps, num_stages=stages,
                                     **({"maxnreg": cap} if cap else {}))
                try:
                    kern = prep()
                    res = f" regs {kern.n_regs} spills {kern.n_spills} smem {kern.metadata.shared}"
                except Exception as e:  # noqa: BLE001
                    res = f" ({type(e).__name__})"
                _sweep_row(rows, f"{pspec.name} warps {warps:2d} stages {stages} maxnreg {cap:3d}{res}", prep,
                           (warps, stages, cap) == (default.num_warps, default.num_stages, default.maxnreg),
                           f"bf16,k{K},v{V},{gate},{pspec.name},w{warps},s{stages}" + (f",r{cap}" if cap else ""),
                           "gated_delta_prefill_prep_sweep")
            run_kernel(pspec, paxes, pgrid, pargs)  # the next kernel reads the workspace this one wrote
        del q, k, v, g, beta, state, out, pre
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--sweep", action="store_true", help="also time other launch choices of both kernels (JIT)")
    ap.add_argument("--shapes", default=None, help="comma-separated shape names (default all)")
    ap.add_argument("--gates", default="gdn,kda", help="gdn, kda or both (fla's chunk_kda autotuning takes minutes)")
    ap.add_argument("--no-fla", dest="fla", action="store_false", help="aotc alone")
    ap.add_argument("--kernels", action="store_true", help="also print each call's time by kernel")
    ap.add_argument("--prep-sweep", default=None, help="W:S:R,... precompute num_warps, num_stages, maxnreg to time (JIT)")
    a = ap.parse_args()
    rows = Rows(a.out)

    def cut(signum, frame):  # a time limit's SIGTERM: what fla's autotuners chose so far still gets out
        report_configs(rows)
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, cut)
    bw = copy_bandwidth()
    print(f"device-to-device copy: {bw / 1e9:.0f} GB/s")
    gluon = torch.cuda.get_device_capability() == (9, 0) and os.environ.get(state_ws_spec.ENV_WS, "1") != "0"
    state_pass = "gluon_state" if gluon else "triton_state"
    print(f"state pass: {state_pass}")
    print("ms: summed kernel durations of one call (events: aotc V-major by CUDA events, L2 emptied)")
    print(f"{'shape':9s} {'gate':4s} {'aotc V':>8s} {'fla V':>8s} {'fla/aotc':>8s} {'aotc K':>8s} {'fla K':>8s} "
          f"{'fla/aotc':>8s} {'events V':>9s} {'floor':>7s}")
    notes = set()
    wanted = a.shapes.split(",") if a.shapes else None
    for name, lengths in SHAPES:
        if wanted and name not in wanted:
            continue
        for kda in [g == "kda" for g in a.gates.split(",")]:
            times, prov = {}, "aot"
            for layout in ("vmajor", "kmajor"):
                q, k, v, g, beta, state, idx, cu = make(lengths, kda, layout)
                out = torch.empty_like(v)

                def call():
                    op.gated_delta_prefill(q, k, v, g, beta, state, idx, cu, qk_l2norm=True, state_layout=layout,
                                           out=out, validate=False)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    call()
                if any(issubclass(w.category, AotcJitFallbackWarning) for w in caught):
                    prov = "aot_jit_fallback"
                times[layout] = kernel_time(call)
                if layout == "vmajor":
                    times["events"] = device_time(call)
                if a.kernels and layout == "vmajor":
                    print_split(rows, "aotc", f"{name} h{H}/{HV}", f"bf16,k{K},v{V},{'kda' if kda else 'gdn'}",
                                kernel_split(call))
                fn, why = fla_call(q, k, v, g, beta, lengths, kda, layout == "vmajor") if a.fla else (None, "")
                times["fla_" + layout] = kernel_time(fn) if fn else float("nan")
                if fn and a.kernels and layout == "vmajor":
                    print_split(rows, "fla", f"{name} h{H}/{HV}", f"bf16,k{K},v{V},{'kda' if kda else 'gdn'}",
                                kernel_split(fn))
                if why:
                    notes.add(why)
                del q, k, v, g, beta, state, out, fn
                torch.cuda.empty_cache()
            floor = floor_bytes(lengths, kda) / bw
            variant = f"bf16,k{K},v{V},{'kda' if kda else 'gdn'},{state_pass}"
            shape = f"{name} h{H}/{HV}"
            for p, key in ((prov + "_vmajor_kernels", "vmajor"), (prov + "_kmajor_kernels", "kmajor"),
                           ("fla_vfirst_kernels", "fla_vmajor"), ("fla_kmajor_kernels", "fla_kmajor"),
                           (prov + "_vmajor", "events")):
                if times[key] == times[key]:
                    rows.add("gated_delta_prefill", variant, p, shape, "ms", times[key] * 1e3)
            rows.add("gated_delta_prefill", variant, "bandwidth_floor", shape, "ms", floor * 1e3)
            ms = {key: t * 1e3 for key, t in times.items()}
            print(f"{name:9s} {'kda' if kda else 'gdn':4s} {ms['vmajor']:8.3f} {ms['fla_vmajor']:8.3f} "
                  f"{ms['fla_vmajor'] / ms['vmajor']:8.2f} {ms['kmajor']:8.3f} {ms['fla_kmajor']:8.3f} "
                  f"{ms['fla_kmajor'] / ms['kmajor']:8.2f} {ms['events']:9.3f} {floor * 1e3:7.3f}"
                  + (f"  [{prov}]" if prov != "aot" else ""), flush=True)
    for n in sorted(notes):
        print("note:", n)
    report_configs(rows)
    if a.prep_sweep:
        prep_sweep(rows, [tuple(int(x) for x in c.split(":")) for c in a.prep_sweep.split(",")], a.gates.split(","))
    if a.sweep:
        sweep(rows)


def report_configs(rows):
    for kernel, chosen in sorted(fla_configs().items()):
        for key, cfg in chosen.items():
            print(f"fla config {kernel} {key}: {cfg}", flush=True)
            rows.add("gated_delta_prefill", kernel, "fla_autotune", key, "config", cfg)


if __name__ == "__main__":
    main()
