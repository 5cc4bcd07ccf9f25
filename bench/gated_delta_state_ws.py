"""The warp-specialized Gluon state pass (kernels/gated_delta/chunk_state_ws.py) checked and timed
against chunk.py's Triton state pass, standalone (JIT; nothing of the op's dispatch involved).

Correctness: small packed batches with block-edge lengths and a padded sequence (GDN and KDA,
bf16/fp16, both pool layouts, K = V = 64, 96, 128) against the float32 reference and against the
Triton state pass on the same precompute; NaN-poisoned outputs, untouched pool slots. Speed: H = 16,
HV = 32, K = V = 128, bf16, 1 x 8192 and 8 x 2048: the precompute, the Triton state pass at its
tiles, the Gluon one at BV 32 / 64 / 128 (median of triton.testing.do_bench, L2 warm).
Writes a JSON summary to --out; prints a short table.
"""
import argparse
import json
import sys
import warnings

import torch

from aotc.kernels.gated_delta import chunk_spec
from aotc.kernels.gated_delta import chunk_state_ws as ws
from aotc.kernels.gated_delta.reference import gated_delta_reference
from aotc.loader.dispatch import run_kernel
from aotc.loader.ops.gated_delta_prefill import launch_plan
from bench_gated_delta_prefill import make  # H 16, HV 32, K = V = 128, bf16: issue 38's shapes
from tests.cpu.kernels.gated_delta.chunk_cases import make_case, rel_err

DEV = "cuda"
TOL = {torch.float16: 1e-2, torch.bfloat16: 3e-2}  # tests/gpu/test_gated_delta_prefill.py's GPU_TOL
LONG = [1, 63, 64, 65, 1000, 0, 2500, 40]


def plan(q, k, v, g, beta, state, idx, cu, layout, bv):
    out = torch.full(v.shape, float("nan"), dtype=q.dtype, device=DEV)
    *prep, st = launch_plan(q, k, v, g, beta, state, idx, cu, out, q.shape[-1] ** -0.5, True, layout, bv=bv)
    return prep, st  # prep: the precompute's launches (GDN one, KDA three)


def run_prep(prep):
    for launch in prep:
        run_kernel(*launch)


def with_io(st_args, out, pool):
    a = list(st_args)
    a[6], a[7] = out, pool
    return tuple(a)


def run_triton(st, out, pool):
    spec, axes, grid, args = st
    run_kernel(spec, axes, grid, with_io(args, out, pool))


# (BV a program, consumer warpgroups)
WS_CONFIGS = [(32, 1), (64, 1), (64, 2), (128, 2)]


def run_ws(st, out, pool, cfg):
    bv, nc = cfg
    spec, axes, grid, args = st
    K, V = int(axes["head_k"]), int(axes["head_v"])
    grid = (grid[0], grid[1], V // bv)
    return ws.gdn_chunk_state_ws[grid](*with_io(args, out, pool), HEAD_K=K, HEAD_V=V, BV=bv, NC=nc, num_warps=4)


def fresh(v, state):
    return torch.full(v.shape, float("nan"), dtype=v.dtype, device=DEV), state.clone()


def check_cases(res):
    cases = [(torch.bfloat16, False, "vmajor", 128), (torch.bfloat16, False, "kmajor", 128),
             (torch.float16, True, "vmajor", 128), (torch.bfloat16, True, "kmajor", 128),
             (torch.float16, False, "kmajor", 128), (torch.bfloat16, False, "vmajor", 64),
             (torch.bfloat16, True, "kmajor", 96)]
    ok = True
    for i, (dtype, kda, layout, d) in enumerate(cases):
        c = make_case(LONG, H=2, HV=4, K=d, V=d, dtype=dtype, kda=kda, strong_gates=kda, padded=(7,),
                      state_layout=layout, device=DEV, seed=10 + i)
        ref_out, ref_pool = gated_delta_reference(c["q"], c["k"], c["v"], c["g"], c["beta"], c["state"],
                                                  c["state_indices"], c["cu_seqlens"], qk_l2norm=True,
                                                  state_layout=layout)
        prep, st = plan(c["q"], c["k"], c["v"], c["g"], c["beta"], c["state"], c["state_indices"], c["cu_seqlens"],
                        layout, 32)
        run_prep(prep)
        t_out, t_pool = fresh(c["v"], c["state"])
        run_triton(st, t_out, t_pool)
        idx = c["state_indices"].long()
        used = idx[idx >= 0]
        untouched = torch.ones(c["state"].shape[0], dtype=torch.bool, device=DEV)
        untouched[used] = False
        tile = chunk_spec.head_tile(d)
        for cfg in WS_CONFIGS:
            bv = cfg[0]
            if bv > tile or (bv // cfg[1]) > tile:
                continue
            out, pool = fresh(c["v"], c["state"])
            run_ws(st, out, pool, cfg)
            torch.cuda.synchronize()
            row = {"dtype": str(dtype)[6:], "kda": kda, "layout": layout, "d": d, "bv": bv, "nc": cfg[1],
                   "nan_out": bool(out.isnan().any()), "err_out": rel_err(out, ref_out),
                   "err_pool": rel_err(pool[used], ref_pool[used]),
                   "vs_triton_out": rel_err(out, t_out), "vs_triton_pool": rel_err(pool[used], t_pool[used]),
                   "triton_err_out": rel_err(t_out, ref_out),
                   "untouched_ok": bool(torch.equal(pool[untouched].view(torch.int32),
                                                    c["state"][untouched].view(torch.int32))),
                   "bitwise_out": bool(torch.equal(out, t_out))}
            cu = c["cu_seqlens"].tolist()
            row["padded_zero"] = all(bool((out[0, cu[n]:cu[n + 1]] == 0).all())
                                     for n, s in enumerate(idx.tolist()) if s < 0)
            row["ok"] = (not row["nan_out"] and row["err_out"] <= TOL[dtype] and row["err_pool"] <= TOL[dtype]
                         and row["untouched_ok"] and row["padded_zero"])
            ok &= row["ok"]
            res["cases"].append(row)
            print(f"case {row['dtype']} kda={kda:d} {layout} d{d} bv{bv}x{cfg[1]}: out {row['err_out']:.2e} "
                  f"pool {row['err_pool']:.2e} (triton {row['triton_err_out']:.2e}) vs triton "
                  f"{row['vs_triton_out']:.2e}/{row['vs_triton_pool']:.2e} bit={row['bitwise_out']} "
                  f"{'OK' if row['ok'] else 'FAIL'}", flush=True)
    return ok


def timing(res):
    from triton.testing import do_bench

    x = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    do_bench(lambda: x @ x, warmup=200, rep=500)  # clocks up before the first timed kernel
    del x

    for name, lengths in (("1x8192", [8192]), ("8x2048", [2048] * 8)):
        for layout in ("vmajor", "kmajor"):
            q, k, v, g, beta, state, idx, cu = make(lengths, False, layout)
            prep, st = plan(q, k, v, g, beta, state, idx, cu, layout, 32)
            run_prep(prep)
            row = {"shape": name, "layout": layout}
            if layout == "vmajor":
                row["prep_ms"] = do_bench(lambda: run_prep(prep), warmup=50, rep=300, return_mode="median")
            t_out, t_pool = fresh(v, state)
            run_triton(st, t_out, t_pool)
            for bv in (32, 128):
                _, st_b = plan(q, k, v, g, beta, state, idx, cu, layout, bv)
                st_b = (st_b[0], st_b[1], st_b[2], st[3])  # the same workspace
                o, p = fresh(v, state)
                row[f"triton_bv{bv}_ms"] = do_bench(lambda: run_triton(st_b, o, p), warmup=50, rep=300,
                                                    return_mode="median")
            for cfg in WS_CONFIGS:
                tag = f"ws_bv{cfg[0]}x{cfg[1]}"
                out, pool = fresh(v, state)
                kern = run_ws(st, out, pool, cfg)
                torch.cuda.synchronize()
                row[f"{tag}_vs_triton_out"] = rel_err(out, t_out)
                row[f"{tag}_vs_triton_pool"] = rel_err(pool, t_pool)
                row[f"{tag}_nan"] = bool(out.isnan().any())
                row[f"{tag}_regs"] = [getattr(kern, "n_regs", None), getattr(kern, "n_spills", None),
                                      kern.metadata.shared]
                o, p = fresh(v, state)
                row[f"{tag}_ms"] = do_bench(lambda: run_ws(st, o, p, cfg), warmup=50, rep=300, return_mode="median")
            o, p = fresh(v, state)  # the baseline again: the spread between two timings of one kernel
            row["triton_bv32_again_ms"] = do_bench(lambda: run_triton(st, o, p), warmup=50, rep=300,
                                                   return_mode="median")
            res["timing"].append(row)
            print(name, layout, {k_: (round(v_, 4) if isinstance(v_, float) else v_) for k_, v_ in row.items()},
                  flush=True)
            del q, k, v, g, beta, state, prep, st


def profile():
    """One launch of the Triton state pass and of each Gluon config at 1 x 8192 (for ncu)."""
    q, k, v, g, beta, state, idx, cu = make([8192], False, "vmajor")
    prep, st = plan(q, k, v, g, beta, state, idx, cu, "vmajor", 32)
    run_prep(prep)
    for cfg in WS_CONFIGS:  # compiled before the profiled launches
        run_ws(st, *fresh(v, state), cfg)
    run_triton(st, *fresh(v, state))
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    run_triton(st, *fresh(v, state))
    for cfg in WS_CONFIGS:
        run_ws(st, *fresh(v, state), cfg)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="state_ws.json")
    ap.add_argument("--skip-cases", action="store_true")
    ap.add_argument("--profile", action="store_true", help="one launch of each state pass, for ncu")
    a = ap.parse_args()
    if a.profile:
        warnings.simplefilter("ignore")
        return profile()
    warnings.simplefilter("ignore")
    res = {"device": torch.cuda.get_device_name(), "cases": [], "timing": []}
    ok = True
    try:
        if not a.skip_cases:
            ok = check_cases(res)
        timing(res)
    finally:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    print("ALL CASES OK" if ok else "SOME CASES FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
