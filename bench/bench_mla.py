"""MLA decode (DeepSeek latent cache [pages, 64, 1, 576] bf16, value = first 512 channels): aotc's
`loader.mla_decode` (AOT) beside vLLM's Triton MLA decode (`decode_attention_fwd(..., is_mla=True)`,
its split count as vLLM's Triton MLA backend picks it: next_pow2(context // 512), at most 2 x SMs)
and the device-to-device copy bandwidth of the same run. 16 and 128 query heads, batch 1 / 32 /
128, 4K and 32K context. Metrics: device time (CUDA events, L2 emptied before each call), the
kernels' summed time (torch.profiler, L2 warm), cache bytes read once over device time (% of copy)
and TFLOP/s (2 x heads x tokens x (576 + 512) a request).

vLLM's kernel is not part of aotc: pass `--vllm-shim DIR`, a folder holding vLLM 0.33.0's
vllm/v1/attention/ops/triton_decode_attention.py (taken from its sdist) as
vllm/v1/attention/ops/_vllm_triton_decode_attention.py beside stub vllm.platforms /
vllm.triton_utils modules; without it the vLLM rows are left out.
`--sweep`: also time the split kernel at other tiles (heads a program, tokens a tile, warps,
stages) through Triton's JIT, for choosing kernels/decode/mla_spec.py's table.
`--kernels`: also the 16-head 32 x 4K, 1 x 32K and 1 x 4K calls with their split and merge kernels
timed one by one (torch.profiler, L2 warm) and 32-head calls (the h32 tile): rows "aot-pass2".
`--split-sweep`: also 16-head calls at other `num_splits=`: rows "aot-S<splits>". Both were
bench/mla_double_buffer.py's (bench/results/2026-11-27-h100-43f4b3f-mla-double-buffer.jsonl).
"""
from __future__ import annotations

import argparse
import math
import sys

import torch
import triton

from aotc import loader
from aotc.loader.ops import mla as mla_ops
from harness import Rows, copy_bandwidth, device_time, kernel_time, kernel_times

D_QK, D_V, PAGE = 576, 512, 64
SHAPES = [(h, b, ctx) for h in (16, 128) for b in (1, 32, 128) for ctx in (4096, 32768)]
# --sweep: (heads a program, tokens a tile, warps, stages) at SWEEP_SHAPES (heads, batch, context)
CONFIGS = ((16, 32, 4, 2), (16, 32, 4, 3), (16, 32, 4, 4), (16, 16, 4, 4), (16, 32, 8, 3), (16, 32, 2, 3),
           (32, 32, 4, 2), (32, 32, 4, 3), (32, 32, 8, 2), (32, 64, 8, 2), (64, 64, 8, 2))
SWEEP_SHAPES = ((16, 32, 32768), (16, 128, 4096), (32, 32, 32768), (32, 128, 4096), (128, 32, 4096))
# --kernels: (heads, batch, context) timed kernel by kernel, then the 32-head calls;
# --split-sweep: (batch, context, num_splits counts) at 16 heads
KERNEL_SHAPES = ((16, 32, 4096), (16, 1, 32768), (16, 1, 4096))
H32_SHAPES = ((32, 32, 4096), (32, 32, 32768), (32, 128, 4096))
SPLIT_SWEEP = ((32, 4096, (4, 6, 12, 16)), (1, 32768, (128, 192)), (1, 4096, (64, 128)))


def problem(batch, heads, ctx, seed=0):
    g = torch.Generator("cuda").manual_seed(seed)
    pages_per = ctx // PAGE
    pages = batch * pages_per
    kv = torch.randn(pages, PAGE, 1, D_QK, generator=g, device="cuda").to(torch.bfloat16)
    table = torch.randperm(pages, generator=g, device="cuda").view(batch, pages_per).to(torch.int32)
    q = torch.randn(batch, heads, D_QK, generator=g, device="cuda").to(torch.bfloat16)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    return q, kv, table, lens


def aot_call(q, kv, table, lens, out, splits=None):
    """(the loader call, its split count): loader.mla_decode into out, num_splits=splits (None: the op's)."""
    def fn():
        return loader.mla_decode(q, kv, table, lens, v_head_dim=D_V, out=out, num_splits=splits, validate=False)
    mla_ops._plans.clear()
    mla_ops._recent.clear()  # an earlier call's steady state would skip the plan
    fn()
    (plan,) = mla_ops._plans.values()
    return fn, plan.split_grid[2]


def aot_pass(rows, copy_bw, heads, batch, ctx, splits=None, kernels=False):
    """One call's device time as rows "aot-pass2" (num_splits=splits: "aot-S<splits>"); kernels: also
    each kernel's time (kernel_us_split, kernel_us_merge)."""
    q, kv, table, lens = problem(batch, heads, ctx)
    out = torch.empty(batch, heads, D_V, dtype=q.dtype, device="cuda")
    fn, used = aot_call(q, kv, table, lens, out, splits)
    t = device_time(fn)
    nbytes = batch * ctx * D_QK * 2
    shape = f"B{batch}xH{heads}x{ctx}"
    prov = "aot-pass2" if splits is None else f"aot-S{splits}"
    for metric, value in (("us", t * 1e6), ("pct_copy", nbytes / t / copy_bw * 100), ("splits", used)):
        rows.add("mla_decode", "latent-bf16-p64", prov, shape, metric, value)
    msg = f"{shape:>18} {prov:>9} splits {used:4d} {t * 1e6:8.1f} us {nbytes / t / copy_bw * 100:6.1f}% copy"
    if kernels:
        for name, sec in kernel_times(fn).items():
            short = "split" if "split" in name else ("merge" if "merge" in name else name[:20])
            rows.add("mla_decode", "latent-bf16-p64", prov, shape, f"kernel_us_{short}", sec * 1e6)
            msg += f"  {short} {sec * 1e6:.1f}"
    print(msg, flush=True)
    del q, kv, table, lens
    torch.cuda.empty_cache()


def vllm_call(vllm_fwd, q, kv, table, lens, sms):
    batch, heads = q.shape[:2]
    splits = min(triton.next_power_of_2(max(1, int(lens.max()) // 512)), 2 * sms)
    o = torch.zeros(batch, heads, D_V, dtype=q.dtype, device="cuda")
    lse = torch.zeros(batch, heads, dtype=q.dtype, device="cuda")
    logits = torch.empty(batch, heads, splits, D_V + 1, dtype=torch.float32, device="cuda")
    one = torch.ones((), dtype=torch.float32, device="cuda")
    scale = 1.0 / math.sqrt(D_QK)

    def run():
        vllm_fwd(q, kv, kv[..., :D_V], o, lse, table, lens, logits, splits, scale, PAGE, k_scale=one, v_scale=one,
                 is_mla=True)
    return run, o, splits


def sweep(rows, copy_bw, shapes, configs=CONFIGS, splits_for=None):
    """The split kernel at other tiles through the JIT (merge as the loader runs it); splits from
    decode's rule without the binary's occupancy, or `splits_for(heads, batch, ctx)`."""
    from aotc.kernels.decode import spec as DS
    from aotc.kernels.decode import mla_spec as S
    from aotc.kernels.decode.mla_kernel import mla_split_kernel
    from aotc.loader import workspace
    from aotc.loader.dispatch import run_kernel
    from aotc.loader.ops import mla as M
    from aotc.loader.ops.split_merge import split_args

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for heads, batch, ctx in shapes:
        q, kv, table, lens = problem(batch, heads, ctx)
        out = torch.empty(batch, heads, D_V, dtype=q.dtype, device="cuda")
        c = M.check(q, kv, kv[..., :D_V], table, lens, None, None, None, "auto", None, None, None, None, True, out,
                    None)
        nbytes = batch * ctx * D_QK * 2
        for bh, bn, warps, stages, *cap in configs:  # cap: a register cap (maxnreg), when given
            regs = {"maxnreg": cap[0]} if cap else {}
            if bh > heads or (bh < 32 and heads >= 128) or (bh == 64 and heads < 64):
                continue
            axes = S.split_axes("bf16", "bf16", D_QK, D_V, "latent", "h16")
            cx = S.split_constexprs(axes)
            cx.update(BLOCK_H=bh, BLOCK_N=bn, PDL=0, PTX=1)
            hb = -(-heads // bh)
            splits = splits_for(heads, batch, ctx, *cap) if splits_for else DS.num_splits(batch, hb, 1, sms, None)
            grid = (hb, batch, splits)
            n_o, n_lse = DS.workspace_elements(batch, heads, splits, D_V)
            part_o, part_lse = workspace.pair(q.device, n_o, n_lse)
            ints = [c.sm_scale, 0, 0, PAGE.bit_length() - 1, table.shape[1], table.stride(0), heads, heads,
                    q.stride(0), q.stride(1), *kv.stride()[:3], *kv.stride()[:3]]
            args = split_args(False, False, q, kv, kv[..., :D_V], None, None, table, None, lens, part_o, part_lse, ints)
            merge_axes = S.merge_axes("bf16", D_V, splits)

            def run():
                mla_split_kernel[grid](*args, **cx, num_warps=warps, num_stages=stages, **regs)
                run_kernel(S.MERGE, merge_axes, DS.merge_grid(batch, heads, merge_axes),
                           [part_o, part_lse, part_lse, out, part_lse, 0, 0, heads, splits, out.stride(0),
                            out.stride(1), 0])
            name = f"h{bh}-n{bn}-w{warps}-s{stages}" + (f"-r{cap[0]}" if cap else "") + \
                (f"-S{splits}" if splits_for else "")
            try:
                t = device_time(run)
            except Exception as e:  # noqa: BLE001 - a config that does not compile (shared memory)
                print(f"  sweep {name}: {type(e).__name__}: {str(e)[:120]}")
                continue
            flops = 2 * batch * heads * ctx * (D_QK + D_V)
            shape = f"B{batch}xH{heads}x{ctx}"
            print(f"  sweep {shape} {name} splits {splits}: {t * 1e6:8.1f} us  {nbytes / t / copy_bw * 100:5.1f}% "
                  f"copy  {flops / t / 1e12:6.1f} TFLOP/s")
            rows.add("mla_decode", "latent-bf16-p64", f"sweep-{name}", shape, "us", t * 1e6)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None, help="append result rows (JSON lines) to this file")
    ap.add_argument("--vllm-shim", default=None, help="folder with the shimmed vllm package (see the docstring)")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--heads", type=int, default=0, help="only the rows of this many query heads")
    ap.add_argument("--kernels", action="store_true", help="also the per-kernel and 32-head passes (aot-pass2)")
    ap.add_argument("--split-sweep", action="store_true", help="also 16-head calls at other num_splits (aot-S<n>)")
    args = ap.parse_args()
    rows = Rows(args.out)
    copy_bw = copy_bandwidth()
    print(f"device-to-device copy: {copy_bw / 1e9:.0f} GB/s")
    rows.add("copy", "d2d", "copy", "2GiB", "GBps", copy_bw / 1e9)
    vllm_fwd = None
    if args.vllm_shim:
        sys.path.insert(0, args.vllm_shim)
        from vllm.v1.attention.ops._vllm_triton_decode_attention import decode_attention_fwd as vllm_fwd
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{'shape':>18} {'provider':>8} {'us':>9} {'kern us':>9} {'GB/s':>7} {'%copy':>6} {'TFLOP/s':>8}")
    for heads, batch, ctx in SHAPES:
        if args.heads and heads != args.heads:
            continue
        q, kv, table, lens = problem(batch, heads, ctx)
        shape = f"B{batch}xH{heads}x{ctx}"
        nbytes = batch * ctx * D_QK * 2
        flops = 2 * batch * heads * ctx * (D_QK + D_V)
        out = torch.empty(batch, heads, D_V, dtype=q.dtype, device="cuda")
        fn, used = aot_call(q, kv, table, lens, out)
        calls = [("aot", fn)]
        print(f"{shape:>18} aotc splits {used}")
        rows.add("mla_decode", "latent-bf16-p64", "aot", shape, "splits", used)
        if vllm_fwd is not None:
            run, o_vllm, splits = vllm_call(vllm_fwd, q, kv, table, lens, sms)
            calls.append(("vllm", run))
        for provider, fn in calls:
            t = device_time(fn)
            tk = kernel_time(fn)
            for metric, value in (("us", t * 1e6), ("kernel_us", tk * 1e6), ("GBps", nbytes / t / 1e9),
                                  ("pct_copy", nbytes / t / copy_bw * 100), ("TFLOPs", flops / t / 1e12)):
                rows.add("mla_decode", "latent-bf16-p64", provider, shape, metric, value)
            print(f"{shape:>18} {provider:>8} {t * 1e6:9.1f} {tk * 1e6:9.1f} {nbytes / t / 1e9:7.0f} "
                  f"{nbytes / t / copy_bw * 100:6.1f} {flops / t / 1e12:8.1f}")
        if vllm_fwd is not None:
            err = (out.float() - o_vllm.float()).abs().max().item()
            print(f"{shape:>18} max |aot - vllm| {err:.3g} (vllm splits {splits})")
        del q, kv, table, lens
        torch.cuda.empty_cache()
    if args.kernels:
        for shape in KERNEL_SHAPES:
            aot_pass(rows, copy_bw, *shape, kernels=True)
        for shape in H32_SHAPES:
            aot_pass(rows, copy_bw, *shape)
    if args.split_sweep:
        for batch, ctx, counts in SPLIT_SWEEP:
            for splits in counts:
                aot_pass(rows, copy_bw, 16, batch, ctx, splits=splits)
    if args.sweep:
        sweep(rows, copy_bw, SWEEP_SHAPES)


if __name__ == "__main__":
    main()
