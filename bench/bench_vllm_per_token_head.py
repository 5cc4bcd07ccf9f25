"""Decode on vLLM 0.33's per-token-head KV caches: vLLM's unified_attention against aotc's decode
on the same buffers, against the copy bandwidth of the same run.

vLLM's Triton backend stores per (token, kv head) [K codes (D) | K scale fp32 | V codes (D) | V
scale fp32] in one buffer (NHD, vllm/v1/attention/backends/triton_attn.py: customize_spec,
_ensure_scale_caches), so V starts 4 bytes past a 16-byte boundary and the scale caches are
strided float32 views. INT4_PER_TOKEN_HEAD: nibbles and fp32 scale words in separate tensors
(int4_cache); aotc's decode with kv_format "int4_rht" (q and each split's partial output rotated
inside the split kernel), and aotc_unrotated: kv_format "int4_zp", the same codes read without the
rotations. Built here exactly so (codes and scales random, scales positive), then:
  vllm         vLLM's unified_attention (INT8_PER_TOKEN_HEAD / FP8_PER_TOKEN_HEAD), with the
               backend's split-K threshold (128 // kv_heads sequences) and 16 softmax segments
  aotc         aotc.loader.decode on the same buffers (k[..., :D] views, scale views [..., None]):
               the kv_align 8 binaries (validate=False)
  aotc_native  aotc's own int8 layout (codes [blocks, 16, kv_heads, D] and fp32 scales apart, 16-byte
               rows) holding the same values: the 16-byte per-token binary (int8 only)
  ceiling      the bytes read (codes and scales) over this run's device-to-device copy bandwidth
Times: medians of CUDA-event timings, the L2 emptied by a read before each call
(harness.device_time), and kernel time summed by torch.profiler beside them (vLLM's Python
wrapper runs between the events). Shapes: 32 / 8 heads, D 128, block 16, 8K context, batch 32 and
64. vLLM's files come from its sdist (AOTC_VLLM_PEER or --peer: the sdist or an extracted folder),
through the conformance runner's sandbox (shimmed imports; nothing of vLLM's is in the repo).
--stages 2,3,4 sweeps the kv_align 4 binaries' pipeline depth instead (each JIT-compiled with that
num_stages through an empty artifacts folder: the bytes a build with that config would make).
--kv-align 4,8 times the split kernel's KV_ALIGN 4 and 8 reads of the same buffer (8, the loader's
choice here: K 8 bytes at a time, V 4 at a time at K's row offsets), every aotc call JIT-compiled
through an empty artifacts folder (the bytes an AOT build of that key would make).
--a8-configs 2:168,2:0 times the kv_align 8 binaries (the loader's choice here) at each num_stages
and register cap (0: none), JIT-compiled the same way.
    python3 bench_vllm_per_token_head.py --peer PATH [--out results.jsonl] [--stages 2,3,4 | --kv-align 4,8 |
        --a8-configs 2:168,2:0]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile

import torch

from aotc import loader
from harness import Rows, copy_bandwidth, timed

HEADS, KV_HEADS, D, BS, CTX = 32, 8, 128, 16, 8192
BATCHES = (32, 64)
MODES = {"INT8_PER_TOKEN_HEAD": (2, torch.int8, "int8"), "FP8_PER_TOKEN_HEAD": (3, torch.float8_e4m3fn, "fp8_e4m3"),
         "INT4_PER_TOKEN_HEAD": (4, torch.uint8, "int4_rht")}


def vllm_module(peer: str):
    """vLLM's triton_unified_attention, imported from a sandbox of its own files."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from tests.gpu.conformance import vllm_runner

    work = tempfile.mkdtemp(prefix="aotc-vllm-bench-")
    root = vllm_runner.locate_peer(peer, os.path.join(work, "peer"))
    sys.path.insert(0, vllm_runner.build_sandbox(root, "vllm", os.path.join(work, "vllm")))
    from vllm.v1.attention.ops import triton_unified_attention

    return triton_unified_attention


def int4_cache(blocks: int, gen):
    """INT4_PER_TOKEN_HEAD: random nibbles [blocks, BS, KV_HEADS, D // 2] uint8 and scale caches
    [blocks, BS, KV_HEADS] fp32 words (scale 0.01-0.02, a random zero point in the low 4 bits),
    codes and scales apart as vLLM's tests pass them (vLLM 0.33's backend layout for int4 is not
    among the files used here)."""
    k = torch.randint(0, 256, (blocks, BS, KV_HEADS, D // 2), dtype=torch.uint8, device="cuda", generator=gen)
    v = torch.randint(0, 256, (blocks, BS, KV_HEADS, D // 2), dtype=torch.uint8, device="cuda", generator=gen)
    words = []
    for _ in range(2):
        scale = 0.01 + 0.01 * torch.rand(blocks, BS, KV_HEADS, device="cuda", generator=gen)
        zp = torch.randint(0, 16, scale.shape, dtype=torch.int32, device="cuda", generator=gen)
        words.append(((scale.view(torch.int32) & -16) | zp).view(torch.float32))
    return k, k, v, words[0], words[1]


def inline_cache(blocks: int, dtype, gen):
    """vLLM's buffer and its views: (k, v padded views as the backend passes them, k/v scale caches)."""
    raw = torch.empty(blocks, BS, KV_HEADS, 2 * (D + 4), dtype=torch.uint8, device="cuda")
    codes = torch.randn(blocks, BS, KV_HEADS, 2, D, device="cuda", generator=gen)
    codes = codes.mul(40).round().clamp(-127, 127).to(torch.int8) if dtype == torch.int8 else codes.to(dtype)
    raw[..., :D] = codes[..., 0, :].view(torch.uint8)
    raw[..., D + 4:2 * D + 4] = codes[..., 1, :].view(torch.uint8)
    f32 = raw.view(torch.float32)
    f32[..., D // 4] = 0.01 + 0.01 * torch.rand(blocks, BS, KV_HEADS, device="cuda", generator=gen)
    f32[..., (2 * D + 4) // 4] = 0.01 + 0.01 * torch.rand(blocks, BS, KV_HEADS, device="cuda", generator=gen)
    k = raw[..., :D + 4].view(dtype)
    v = raw[..., D + 4:].view(dtype)
    return raw, k, v, f32[..., D // 4], f32[..., (2 * D + 4) // 4]


@contextlib.contextmanager
def kv_align4_stages(stages):
    """With stages: the kv_align 4 split binaries at that num_stages, JIT-compiled (an empty
    artifacts folder); None: the spec's config and whatever artifacts are loaded."""
    with split_config(4, stages, None):
        yield


@contextlib.contextmanager
def split_config(align, stages, maxnreg):
    """The kv_align `align` split binaries at that num_stages and register cap (None: the spec's;
    maxnreg 0: none), JIT-compiled (an empty artifacts folder); stages and maxnreg None: the spec's
    config and whatever artifacts are loaded."""
    if stages is None and maxnreg is None:
        yield
        return
    from aotc.kernels.decode import spec as S
    from aotc.kernels.variants import LaunchConfig

    declared = S.SPLIT.launch

    def launch(axes, arch):
        cfg = declared(axes, arch)
        if axes.get("kv_align") != align:
            return cfg
        return LaunchConfig(num_warps=cfg.num_warps, num_stages=cfg.num_stages if stages is None else stages,
                            maxnreg=cfg.maxnreg if maxnreg is None else maxnreg, launch_pdl=cfg.launch_pdl)

    object.__setattr__(S.SPLIT, "launch", launch)  # a sweep only: the spec is immutable by design
    loader.set_artifacts(tempfile.mkdtemp(prefix="aotc-empty-"))
    try:
        yield
    finally:
        object.__setattr__(S.SPLIT, "launch", declared)
        loader.set_artifacts(None)


@contextlib.contextmanager
def kv_align_choice(align):
    """With align: the split kernel at that KV_ALIGN where the loader would take 4 or 8, JIT-compiled
    (an empty artifacts folder, plans dropped before and after); None: the loader's choice."""
    if align is None:
        yield
        return
    from aotc.loader.ops import decode as D

    real = D._kv_align

    def choose(kv, per_token, score, head_dim):
        got = real(kv, per_token, score, head_dim)
        return align if got in (4, 8) else got

    D._kv_align = choose  # a measurement only: the buffers here are vLLM's record exactly
    D._plans.clear()
    loader.set_artifacts(tempfile.mkdtemp(prefix="aotc-empty-"))
    try:
        yield
    finally:
        D._kv_align = real
        D._plans.clear()
        loader.set_artifacts(None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", default=os.environ.get("AOTC_VLLM_PEER"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--stages", default="", help="sweep the kv_align 4 binaries' num_stages, e.g. 2,3,4")
    ap.add_argument("--modes", default=",".join(MODES), help="the kv_quant_modes to time, e.g. INT4_PER_TOKEN_HEAD")
    ap.add_argument("--kv-align", default="", help="time the split kernel's KV_ALIGN 4 and 8 reads, e.g. 4,8")
    ap.add_argument("--a8-configs", default="",
                    help="sweep the kv_align 8 binaries' STAGES:MAXNREG (0: no cap), e.g. 2:168,2:0,3:168")
    a = ap.parse_args()
    sweep = [("stages", int(x)) for x in a.stages.split(",")] if a.stages else [None]
    if a.kv_align:
        sweep = [("kv_align", int(x)) for x in a.kv_align.split(",")]
    if a.a8_configs:
        sweep = [("a8cfg", tuple(int(y) for y in x.split(":"))) for x in a.a8_configs.split(",")]
    ua = vllm_module(a.peer)
    rows = Rows(a.out)
    copy_bw = copy_bandwidth()
    print(f"device-to-device copy: {copy_bw / 1e9:.0f} GB/s")
    gen = torch.Generator("cuda").manual_seed(0)
    print(f"{'mode':20s} {'batch':>5s} {'provider':12s} {'event us':>9s} {'kernel us':>9s} {'% copy':>7s}")
    for name, (mode, dtype, fmt) in ((n, MODES[n]) for n in a.modes.split(",")):
        for batch in BATCHES:
            pages = CTX // BS
            blocks = batch * pages + 1
            if dtype == torch.uint8:
                raw, k, v, ks, vs = int4_cache(blocks, gen)
            else:
                raw, k, v, ks, vs = inline_cache(blocks, dtype, gen)
            table = torch.randperm(blocks - 1, device="cuda", generator=gen)[:batch * pages].view(batch, pages)
            table = table.to(torch.int32)
            lens = torch.full((batch,), CTX, dtype=torch.int32, device="cuda")
            q = torch.randn(batch, HEADS, D, device="cuda", generator=gen).to(torch.bfloat16)
            out = torch.empty_like(q)
            qsl = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
            threshold = 128 // KV_HEADS  # the backend's seq_threshold_3D (MIN_LAUNCH_GRID_SIZE_2D // kv heads)
            segs = 16
            seg_o = torch.empty(threshold, HEADS, segs, D, dtype=torch.float32, device="cuda")
            seg_m = torch.empty(threshold, HEADS, segs, dtype=torch.float32, device="cuda")
            seg_e = torch.empty_like(seg_m)

            def vllm_call():
                ua.unified_attention(q, k, v, out, qsl, 1, lens, CTX, D ** -0.5, True, (-1, -1), table, 0, None, None,
                                     None, seq_threshold_3D=threshold, num_par_softmax_segments=segs,
                                     softmax_segm_output=seg_o, softmax_segm_max=seg_m, softmax_segm_expsum=seg_e,
                                     kv_quant_mode=ua.KVQuantMode(mode), k_scale_cache=ks, v_scale_cache=vs)

            out_a = torch.empty_like(q)
            kc, vc, ksv, vsv = k[..., :D], v[..., :D], ks[..., None], vs[..., None]

            def aotc_call():
                loader.decode(q, kc, vc, table, lens, k_scale=ksv, v_scale=vsv, kv_format=fmt, out=out_a,
                              validate=False)

            calls = {"vllm": vllm_call}
            if dtype == torch.int8:
                k_n, v_n = kc.contiguous(), vc.contiguous()
                ks_n, vs_n = ksv.contiguous(), vsv.contiguous()
                out_n = torch.empty_like(q)

                def native_call():
                    loader.decode(q, k_n, v_n, table, lens, k_scale=ks_n, v_scale=vs_n, out=out_n, validate=False)

                calls["aotc_native"] = native_call
            if dtype == torch.uint8:
                out_z = torch.empty_like(q)

                def zp_call():  # the same split and merge without the two rotations: what they cost
                    loader.decode(q, kc, vc, table, lens, k_scale=ksv, v_scale=vsv, kv_format="int4_zp", out=out_z,
                                  validate=False)

                calls["aotc_unrotated"] = zp_call
            nbytes = batch * CTX * KV_HEADS * 2 * ((D // 2 if dtype == torch.uint8 else D) + 4)
            ceiling = nbytes / copy_bw
            shape = f"b{batch} ctx{CTX} h{HEADS}/{KV_HEADS} d{D} page{BS}"
            for choice in sweep:
                what, value = choice if choice is not None else (None, None)
                if what == "a8cfg":
                    ctx, tag = split_config(8, *value), f"aotc_a8_stages{value[0]}_maxnreg{value[1]}"
                else:
                    ctx = kv_align_choice(value) if what == "kv_align" else kv_align4_stages(value)
                    tag = "aotc" if choice is None else f"aotc_{what}{value}"
                with ctx:
                    for provider, fn in {**calls, tag: aotc_call}.items():
                        if choice is not None and provider in calls and choice != sweep[0]:
                            continue  # vLLM and the native layout: once a shape
                        t, kt = timed(rows, "vllm_per_token_head_decode", name, provider, shape, fn)
                        print(f"{name:20s} {batch:5d} {provider:12s} {t * 1e6:9.1f} {kt * 1e6:9.1f} "
                              f"{100 * ceiling / t:6.1f}%")
                    vllm_call()
                    out_a.fill_(float("nan"))
                    aotc_call()
                    torch.cuda.synchronize()
                    diff = (out.float() - out_a.float()).abs().max().item()
                    rows.add("vllm_per_token_head_decode", name, f"{tag}_vs_vllm", shape, "max_abs_diff", diff)
                    print(f"{name:20s} {batch:5d} {tag:12s} max |aotc - vllm| = {diff:.3g}")
            rows.add("vllm_per_token_head_decode", name, "ceiling", shape, "seconds", ceiling)
            print(f"{name:20s} {batch:5d} {'ceiling':12s} {ceiling * 1e6:9.1f}")
            del raw, k, v, ks, vs


if __name__ == "__main__":
    main()
