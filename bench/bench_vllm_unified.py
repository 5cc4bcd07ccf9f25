"""Prefill through vLLM's `unified_attention` signature: aotc.compat.vllm.unified_attention against
vLLM 0.33's own kernel on the same paged caches, against SDPA-flash on the same attention.

Rows are prefill with a cached prefix (each request's `new` queries are the last of its ctx + new
keys, all of them in the paged cache, as vLLM's Triton backend calls it), 32 / 8 heads, D 128,
block 16, bf16 queries, for the cache formats vLLM's backend writes:
  NONE                 bf16 pages [blocks, 16, kv_heads, D]
  FP8_PER_TENSOR       float8_e4m3fn pages, k/v descale tensors [batch, kv_heads] of one value
  INT8_PER_TOKEN_HEAD  vLLM's record [K codes | K scale | V codes | V scale] a (token, head): k, v
  FP8_PER_TOKEN_HEAD   views padded by one scale, the scale caches strided fp32 views of it
Providers:
  aotc   aotc.compat.vllm.unified_attention(..., validate=False), as an engine's hot loop calls it
         (one prefix_prefill call: AOT binary, or its JIT fallback where none is built)
  aotc_checked  the same with the default value checks (one device sync and their host time; NONE only)
  vllm   vLLM's unified_attention (its 2D kernel for these prefill batches; no autotuning)
  sdpa   torch SDPA's flash backend on dense bf16 q / k / v of the same shapes (kv heads repeated
         outside the timing), lower-right causal: the ceiling (issue 35: aotc <= 1.1x its time)
Times: medians of CUDA-event timings with the L2 emptied before each call (harness.device_time),
kernel time summed by torch.profiler beside them (t/sdpa: event times; kernel/sdpa: kernel
times, which leave out vLLM's Python wrapper and aotc's host checks). TFLOP/s counts allowed (query, key) pairs,
4 * D each. Outputs: max |aotc - vllm| on the same inputs. vLLM's files come from its sdist
(--peer / AOTC_VLLM_PEER) through the conformance runner's sandbox; nothing of vLLM's is in the repo.
    python3 bench_vllm_unified.py --peer PATH [--out rows.jsonl] [--modes NONE,...] [--shapes NAME,...]
                                  [--providers aotc,vllm,...] (default: all; the output check needs aotc and vllm)
"""
from __future__ import annotations

import argparse
import os

import torch

from aotc.compat import vllm as compat
from bench_prefix_prefill import pairs, sdpa_flash
from bench_vllm_per_token_head import inline_cache, vllm_module
from harness import Rows, device_time, kernel_time, timed

HEADS, KV_HEADS, D, BS = 32, 8, 128, 16
SHAPES = {"b8 ctx2048+512": (8, 2048, 512), "b1 ctx16384+2048": (1, 16384, 2048), "b4 ctx0+4096": (4, 0, 4096)}
MODES = ("NONE", "FP8_PER_TENSOR", "INT8_PER_TOKEN_HEAD", "FP8_PER_TOKEN_HEAD")


def caches(mode: str, blocks: int, batch: int, gen):
    """(k, v, keyword arguments both calls take) for one cache format."""
    if mode == "NONE":
        k, v = (torch.randn(blocks, BS, KV_HEADS, D, device="cuda", generator=gen).to(torch.bfloat16) for _ in "kv")
        return k, v, {}
    if mode == "FP8_PER_TENSOR":
        k, v = (torch.randn(blocks, BS, KV_HEADS, D, device="cuda", generator=gen).to(torch.float8_e4m3fn)
                for _ in "kv")
        scale = torch.full((batch, KV_HEADS), 0.05, dtype=torch.float32, device="cuda")
        return k, v, {"k_descale": scale, "v_descale": scale}
    dtype = torch.int8 if mode == "INT8_PER_TOKEN_HEAD" else torch.float8_e4m3fn
    _, k, v, ks, vs = inline_cache(blocks, dtype, gen)
    return k, v, {"k_scale_cache": ks, "v_scale_cache": vs}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", default=os.environ.get("AOTC_VLLM_PEER"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--providers", default="aotc,aotc_checked,vllm", help="of aotc, aotc_checked, vllm (sdpa always)")
    a = ap.parse_args()
    providers = set(a.providers.split(","))
    ua = vllm_module(a.peer) if "vllm" in providers else None
    rows = Rows(a.out)
    gen = torch.Generator("cuda").manual_seed(0)
    print(f"{'mode':20s} {'shape':18s} {'provider':8s} {'event us':>9s} {'kernel us':>9s} {'TFLOP/s':>8s} {'t/sdpa':>7s} {'kernel/sdpa':>11s}")
    for shape in a.shapes.split(","):
        batch, ctx, new = SHAPES[shape]
        total = ctx + new
        pages = -(-total // BS)
        blocks = batch * pages + 1
        table = torch.randperm(blocks - 1, device="cuda", generator=gen)[:batch * pages].view(batch, pages)
        table = table.to(torch.int32)
        lens = torch.full((batch,), total, dtype=torch.int32, device="cuda")
        qsl = torch.arange(0, batch * new + 1, new, dtype=torch.int32, device="cuda")
        q = torch.randn(batch * new, HEADS, D, device="cuda", generator=gen).to(torch.bfloat16)
        flops = 4 * D * HEADS * pairs(batch, ctx, new, None)
        dense = (torch.randn(batch, HEADS, new, D, device="cuda", generator=gen).to(torch.bfloat16),
                 torch.randn(batch, KV_HEADS, total, D, device="cuda", generator=gen).to(torch.bfloat16),
                 torch.randn(batch, KV_HEADS, total, D, device="cuda", generator=gen).to(torch.bfloat16))
        sdpa, why = sdpa_flash(dense, None, HEADS, KV_HEADS)
        t_sdpa = device_time(sdpa) if sdpa else float("nan")
        k_sdpa = kernel_time(sdpa) if sdpa else float("nan")
        rows.add("vllm_unified_prefill", "bf16", "sdpa", shape, "seconds", t_sdpa)
        rows.add("vllm_unified_prefill", "bf16", "sdpa", shape, "kernel_seconds", k_sdpa)
        print(f"{'(dense bf16)':20s} {shape:18s} {'sdpa':8s} {t_sdpa * 1e6:9.1f} {k_sdpa * 1e6:9.1f} "
              f"{flops / t_sdpa / 1e12:8.1f} {why}")
        del dense
        for mode in a.modes.split(","):
            k, v, kw = caches(mode, blocks, batch, gen)
            outs = {p: torch.empty_like(q) for p in ("aotc", "vllm")}

            def call(fn, out, qm, **extra):
                return lambda: fn(q, k, v, out, qsl, new, lens, total, D ** -0.5, True, (-1, -1), table, 0, None,
                                  kw.get("k_descale"), kw.get("v_descale"), kv_quant_mode=qm(mode),
                                  k_scale_cache=kw.get("k_scale_cache"), v_scale_cache=kw.get("v_scale_cache"), **extra)

            calls = {"aotc": call(compat.unified_attention, outs["aotc"], lambda m: compat.KVQuantMode[m],
                                  validate=False)}
            if ua is not None:
                calls["vllm"] = call(ua.unified_attention, outs["vllm"], lambda m: ua.KVQuantMode[m])
            if mode == "NONE" and "aotc_checked" in providers:
                calls["aotc_checked"] = call(compat.unified_attention, torch.empty_like(q),
                                             lambda m: compat.KVQuantMode[m])
            try:
                calls["aotc"]()
            except NotImplementedError as e:
                rows.add("vllm_unified_prefill", mode, "aotc", shape, "not_implemented", str(e)[:200])
                print(f"{mode:20s} {shape:18s} aotc: {str(e)[:100]}")
                calls.pop("aotc")
                calls.pop("aotc_checked", None)
            calls = {p: fn for p, fn in calls.items() if p in providers}
            for provider, fn in calls.items():
                fn()
                t, kt = timed(rows, "vllm_unified_prefill", mode, provider, shape, fn)
                print(f"{mode:20s} {shape:18s} {provider:8s} {t * 1e6:9.1f} {kt * 1e6:9.1f} "
                      f"{flops / t / 1e12:8.1f} {t / t_sdpa:7.2f} {kt / k_sdpa:11.2f}")
            if "aotc" not in calls or "vllm" not in calls:
                continue
            for out in outs.values():
                out.fill_(float("nan"))
            for provider in outs:
                calls[provider]()
            torch.cuda.synchronize()
            diff = (outs["aotc"].float() - outs["vllm"].float()).abs().max().item()
            rows.add("vllm_unified_prefill", mode, "aotc_vs_vllm", shape, "max_abs_diff", diff)
            print(f"{mode:20s} {shape:18s} max |aotc - vllm| = {diff:.3g}")
            del k, v, kw


if __name__ == "__main__":
    main()
