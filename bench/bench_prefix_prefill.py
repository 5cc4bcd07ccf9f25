"""Prefix-prefill throughput: TFLOP/s of aotc (the public op: AOT binary, or its JIT fallback when
not built), the same kernel through Triton's JIT, and torch SDPA's flash backend on the same
attention made contiguous (lower-right causal), side by side. Where the op runs the Gluon kernel
(kernel_ws.py: sm90, int8/int4 per token), the Triton kernel's JIT time for the same call is
printed beside it (column "triton": its t/sdpa).

FLOPs count only allowed (query, key) pairs, 4 * head_dim each (QK^T and PV). Times are medians
of CUDA-event timings, the L2 emptied before each call (harness.device_time). Rows: JSON lines at --out.

Issue 20's shapes (B 2, 16/4 heads, D 128, 1024 new tokens over 0 and over 2048 cached, block 32)
run over bf16, int8 and int4 caches (one scale a token and head, and per groups of 64 / 32
channels; int8 also per channel in the head-major Iluvatar layout), each beside SDPA-flash on
the same attention in bf16 with the dequantized cache unpaged. Columns: t/sdpa is our time over
SDPA's (the issue's bar: <= 1.15; the dequantize-then-FA2 approach measured 1.9), and the context
cache's bytes (K + V + scales) against bf16's.

--sweep: the same shapes (filtered by --only) through the JIT under other tiles and launch
choices (BLOCK_M, BLOCK_N, num_warps, num_stages, maxnreg), the spec's first, each checked against
the spec's output (max |difference|, NaN count: a different tile order rounds differently, a
broken choice shows as NaN or a large difference), for choosing spec.tile / spec.launch.
"""
from __future__ import annotations

import argparse
import warnings

import torch
import torch.nn.functional as F

from aotc.kernels.prefix_prefill import spec as pp_spec
from aotc.kernels.prefix_prefill.kernel import prefix_prefill_kernel
from aotc.kernels.common.quant_reference import pack_int4, quantize_reference
from aotc.loader.fallback import jit_function
from aotc.loader.ops import prefix_prefill as pp_op
from harness import Rows, device_time

# (name, batch, context, new tokens, block size, window, cache format, layout, q heads, kv heads);
# a cache format is None (bf16), an fp8 dtype, or "int8" / "int4" (one scale a token), "int8-group64" /
# "int4-group32" (one a token and group of channels) or "int8-channel".
SHAPES = [
    ("b8 ctx2048+512 page16", 8, 2048, 512, 16, None, None, "nhd", 32, 8),
    ("b8 ctx2048+512 page32", 8, 2048, 512, 32, None, None, "nhd", 32, 8),
    ("b1 ctx16384+2048 page16", 1, 16384, 2048, 16, None, None, "nhd", 32, 8),
    ("b1 ctx16384+2048 page32", 1, 16384, 2048, 32, None, None, "nhd", 32, 8),
    ("b1 ctx16384+2048 page16 window4096", 1, 16384, 2048, 16, 4096, None, "nhd", 32, 8),
    ("b8 ctx2048+512 page16 fp8e4m3", 8, 2048, 512, 16, None, torch.float8_e4m3fn, "nhd", 32, 8),
    ("b8 ctx2048+512 page16 vllm-layout", 8, 2048, 512, 16, None, None, "vllm", 32, 8),
    ("b8 ctx2048+512 page16 int8", 8, 2048, 512, 16, None, "int8", "nhd", 32, 8),
    ("b8 ctx2048+512 page16 int4", 8, 2048, 512, 16, None, "int4", "nhd", 32, 8),
    ("b1 ctx16384+2048 page16 int8", 1, 16384, 2048, 16, None, "int8", "nhd", 32, 8),
    ("b1 ctx16384+2048 page16 int4", 1, 16384, 2048, 16, None, "int4", "nhd", 32, 8),
]
for _ctx in (0, 2048):  # issue 20
    for _fmt, _layout in ((None, "nhd"), ("int8", "nhd"), ("int4", "nhd"), ("int8-channel", "hnd"),
                          ("int8-group64", "nhd"), ("int4-group32", "nhd")):
        SHAPES.append((f"b2 ctx{_ctx}+1024 page32 {_fmt or 'bf16'}", 2, _ctx, 1024, 32, None, _fmt, _layout, 16, 4))
HEAD_DIM, DTYPE = 128, torch.bfloat16
# (BLOCK_M, BLOCK_N, num_warps, num_stages, maxnreg; 0: none) tried by --sweep beside the spec's.
# BLOCK_N divides BLOCK_M (the kernel asserts it). maxnreg 168 leaves three 4-warp programs a
# multiprocessor room (65536 registers); the int formats' 128 x 32 tile at 4 warps takes 255.
SWEEP = [(128, 32, 4, 2, 0), (128, 32, 8, 2, 0), (128, 32, 8, 1, 0), (128, 64, 8, 2, 0), (128, 64, 8, 3, 0),
         (64, 32, 4, 2, 0), (64, 32, 4, 2, 168), (64, 32, 4, 1, 168), (64, 64, 4, 2, 0), (64, 64, 4, 3, 0)]


def _quantize(cache, fmt):
    """(codes, scales) of a bf16 cache [blocks, page, heads, D]: decode's formats, one scale a token
    and head, one a token, head and group of N channels (int8-groupN, int4-groupN), or
    (int8-channel) one a kv head and channel; and the values they stand for."""
    if fmt == "int8-channel":
        s = cache.float().abs().amax(dim=(0, 1)).clamp_min(1e-6) / 127  # [heads, D]
        codes = torch.round(cache.float() / s).clamp(-127, 127).to(torch.int8)
        return codes, s, codes.float() * s
    group = int(fmt.split("-group")[1]) if "-group" in fmt else cache.shape[-1]
    fmt = fmt.split("-")[0]
    codes, s = quantize_reference(cache, fmt, group, torch.float32)
    values = codes.float() * s.repeat_interleave(group, dim=-1)
    return (pack_int4(codes) if fmt == "int4" else codes), s, values


def make(batch, ctx, new, page, cache_dtype, layout, q_heads, kv_heads):
    """Paged inputs plus the same keys/values contiguous, [batch, heads, seq, D], for SDPA; and the
    context cache's bytes (K, V and scales)."""
    Q_HEADS, KV_HEADS = q_heads, kv_heads
    seq = ctx + new
    dev = "cuda"
    q = torch.randn(batch, new, Q_HEADS, HEAD_DIM, device=dev, dtype=DTYPE)
    keys = torch.randn(batch, seq, KV_HEADS, HEAD_DIM, device=dev, dtype=DTYPE)
    vals = torch.randn(batch, seq, KV_HEADS, HEAD_DIM, device=dev, dtype=DTYPE)
    pages = max(ctx // page, 1)  # a context of 0 still gets a (never read) table column
    table = torch.randperm(batch * pages, device=dev, dtype=torch.int32).view(batch, pages)
    kw = {"kv_layout": layout}
    kc = torch.zeros(batch * pages, page, KV_HEADS, HEAD_DIM, device=dev, dtype=DTYPE)
    vc = torch.zeros_like(kc)
    if ctx:
        kc[table.long()] = keys[:, :ctx].reshape(batch, pages, page, KV_HEADS, HEAD_DIM)
        vc[table.long()] = vals[:, :ctx].reshape(batch, pages, page, KV_HEADS, HEAD_DIM)
    if isinstance(cache_dtype, str):
        (kc, ks, kval), (vc, vs, vval) = _quantize(kc, cache_dtype), _quantize(vc, cache_dtype)
        if ctx:  # the contiguous copy gets the dequantized values SDPA would see
            keys[:, :ctx] = kval[table.long()].to(DTYPE).reshape(batch, ctx, KV_HEADS, HEAD_DIM)
            vals[:, :ctx] = vval[table.long()].to(DTYPE).reshape(batch, ctx, KV_HEADS, HEAD_DIM)
        if layout == "hnd":
            kc, vc = kc.transpose(1, 2).contiguous(), vc.transpose(1, 2).contiguous()
            if ks.dim() == 4:
                ks, vs = ks.transpose(1, 2).contiguous(), vs.transpose(1, 2).contiguous()
        kw.update(k_scale=ks, v_scale=vs, kv_format=cache_dtype.split("-")[0])
    elif cache_dtype is not None:  # the contiguous copy gets the dequantized values SDPA would see
        scale = torch.tensor([0.05], device=dev)
        kc, vc = (kc.float() / scale).to(cache_dtype), (vc.float() / scale).to(cache_dtype)
        if ctx:
            keys[:, :ctx] = (kc[table.long()].float() * scale).to(DTYPE).reshape(batch, ctx, KV_HEADS, HEAD_DIM)
            vals[:, :ctx] = (vc[table.long()].float() * scale).to(DTYPE).reshape(batch, ctx, KV_HEADS, HEAD_DIM)
        kw.update(k_scale=scale, v_scale=scale.clone())
    if layout == "vllm":
        x = 16 // kc.element_size()
        kc = kc.view(kc.shape[0], page, KV_HEADS, HEAD_DIM // x, x).permute(0, 2, 3, 1, 4).contiguous()
        vc = vc.permute(0, 2, 3, 1).contiguous()
    qsl = torch.arange(0, batch + 1, device=dev, dtype=torch.int32) * new
    lens = torch.full((batch,), seq, device=dev, dtype=torch.int32)
    paged = (q.reshape(-1, Q_HEADS, HEAD_DIM), keys[:, ctx:].reshape(-1, KV_HEADS, HEAD_DIM).contiguous(),
             vals[:, ctx:].reshape(-1, KV_HEADS, HEAD_DIM).contiguous(), kc, vc, table, qsl, lens)
    dense = (q.transpose(1, 2).contiguous(), keys.transpose(1, 2).contiguous(), vals.transpose(1, 2).contiguous())
    per_token = batch * ctx * KV_HEADS * 2  # K and V rows of the context
    nbytes = per_token * (kc[0].numel() * kc.element_size() // (page * KV_HEADS))  # a block's rows, any layout
    if "k_scale" in kw and kw["k_scale"].dim() == 4:  # one a token (and group)
        nbytes += per_token * kw["k_scale"].shape[-1] * kw["k_scale"].element_size()
    elif "k_scale" in kw and kw["k_scale"].dim() == 2:
        nbytes += 2 * kw["k_scale"].numel() * kw["k_scale"].element_size()
    return paged, kw, dense, nbytes


def pairs(batch, ctx, new, window):
    pos = torch.arange(ctx, ctx + new, dtype=torch.float64) + 1  # keys visible to each query
    return batch * float((pos.clamp(max=window) if window else pos).sum())


def sdpa_flash(dense, window, q_heads, kv_heads):
    """The SDPA flash call (or None with a reason) for lower-right causal attention."""
    Q_HEADS, KV_HEADS = q_heads, kv_heads
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    q, k, v = dense
    k = k.repeat_interleave(Q_HEADS // KV_HEADS, dim=1)  # outside the timing: flash wants equal heads
    v = v.repeat_interleave(Q_HEADS // KV_HEADS, dim=1)
    if window:
        # SDPA has no window; FlashAttention-2's own entry point (private, torch >= 2.5) has one.
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

        def fn():
            return torch.ops.aten._flash_attention_forward(qt, kt, vt, None, None, qt.shape[1], kt.shape[1], 0.0,
                                                           True, False, window_size_left=window - 1,
                                                           window_size_right=0)
    else:
        mask = causal_lower_right(q.shape[2], k.shape[2])

        def fn():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    try:
        fn()
        return fn, ""
    except (RuntimeError, TypeError) as e:
        return None, str(e).splitlines()[0][:120]


def sweep(rows, arch, only):
    """Each shape (whose name contains `only`) through the JIT under the SWEEP choices."""
    print(f"\n-- sweep: JIT, d{HEAD_DIM}; BLOCK_M x BLOCK_N, warps, stages, maxnreg; diff and NaN against the "
          "spec's choice --")
    for name, batch, ctx, new, page, window, cache_dtype, layout, q_heads, kv_heads in SHAPES:
        if only and only not in name:
            continue
        paged, kw, dense, _nbytes = make(batch, ctx, new, page, cache_dtype, layout, q_heads, kv_heads)
        flops = 4 * HEAD_DIM * q_heads * pairs(batch, ctx, new, window)
        out = torch.empty_like(paged[0])
        plan = (kw.get("kv_format", "auto"), kw.get("k_scale"), kw.get("v_scale"), HEAD_DIM ** -0.5, window, None,
                None, False)
        axes, _grid, args = pp_op.launch_plan(*paged, out, layout, *plan)
        cx = pp_spec.PREFIX_PREFILL.compile_constexprs(axes, arch)
        cfg = pp_spec.launch(axes, arch)
        default = (cx["BLOCK_M"], cx["BLOCK_N"], cfg.num_warps, cfg.num_stages, cfg.maxnreg)
        fn, _why = sdpa_flash(dense, window, q_heads, kv_heads)
        t_sdpa = device_time(fn) if fn else float("nan")
        print(f"{name} h{q_heads}/{kv_heads}: sdpa {t_sdpa * 1e3:.3f} ms")
        ref = None
        for bm, bn, warps, stages, cap in [default] + [c for c in SWEEP if c != default]:
            grid = (paged[0].shape[0] // bm + batch, q_heads, 1)
            opts = dict(num_warps=warps, num_stages=stages, **({"maxnreg": cap} if cap else {}))

            def call():
                prefix_prefill_kernel[grid](*args, **dict(cx, BLOCK_M=bm, BLOCK_N=bn), **opts)
            label = f"  {bm:3d} x {bn:2d} w{warps} s{stages} r{cap:3d}"
            out.fill_(float("nan"))
            try:
                call()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - a choice that does not compile or launch is reported
                print(f"{label}: failed ({type(e).__name__}: {str(e)[:100]})")
                continue
            got = out.float()
            ref = got.clone() if ref is None else ref
            diff = float((got - ref).abs().nan_to_num(float("inf")).max())
            nans = int(torch.isnan(got).sum())
            t = device_time(call)
            print(f"{label}: {t * 1e3:7.3f} ms {flops / t / 1e12:6.1f} TF/s t/sdpa {t / t_sdpa:5.2f} "
                  f"diff {diff:.1e} nan {nans}" + ("  (spec)" if (bm, bn, warps, stages, cap) == default else ""))
            variant = f"{axes['dtype']},{axes['kv']},{axes['scales']},d{HEAD_DIM},{layout}"
            choice = f",m{bm},n{bn},w{warps},s{stages}" + (f",r{cap}" if cap else "")
            rows.add("prefix_prefill_sweep", variant + choice, "jit",
                     f"{name} h{q_heads}/{kv_heads}", "ms", t * 1e3)
        del paged, dense, out, args
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default=None, metavar="TEXT", help="run the shapes whose name contains TEXT")
    ap.add_argument("--sweep", action="store_true", help="time other tiles and launch choices instead (JIT)")
    a = ap.parse_args()
    rows = Rows(a.out)
    arch = torch.cuda.get_device_capability()[0] * 10 + torch.cuda.get_device_capability()[1]
    if a.sweep:
        sweep(rows, arch, a.only)
        return
    fallback = set()  # variants whose first call warned that no binary was built
    print(f"{'shape':42s} {'aot TF/s':>9s} {'jit TF/s':>9s} {'sdpa TF/s':>10s} {'t/sdpa':>7s} {'cache MB':>9s} "
          f"{'vs bf16':>8s} {'triton':>7s}")
    for name, batch, ctx, new, page, window, cache_dtype, layout, q_heads, kv_heads in SHAPES:
        if a.only and a.only not in name:
            continue
        paged, kw, dense, nbytes = make(batch, ctx, new, page, cache_dtype, layout, q_heads, kv_heads)
        bf16_bytes = batch * ctx * kv_heads * 2 * HEAD_DIM * 2
        flops = 4 * HEAD_DIM * q_heads * pairs(batch, ctx, new, window)
        out = torch.empty_like(paged[0])
        call = dict(kw, window=window, out=out, validate=False)  # no per-call sync in the timed loop
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pp_op.prefix_prefill(*paged, **call)
        plan = (kw.get("kv_format", "auto"), kw.get("k_scale"), kw.get("v_scale"), HEAD_DIM ** -0.5, window, None,
                None, False)
        axes, grid, args = pp_op.launch_plan(*paged, out, layout, *plan)
        if any("not built" in str(w.message) for w in caught):
            fallback.add(str(axes))
        provider = "aot_jit_fallback" if str(axes) in fallback else "aot"
        t_aot = device_time(lambda: pp_op.prefix_prefill(*paged, **call))

        kernel = pp_op.kernel_for(axes, args)  # the kernel the op ran

        def jit_of(k):
            fn, cx = jit_function(k), k.compile_constexprs(axes, arch)
            opts = k.launch_config(axes, arch).triton_options()
            return lambda: fn[grid](*args[:len(k.args)], **cx, **opts)  # the Gluon kernel takes spec.ARGS only
        t_jit = device_time(jit_of(kernel))
        t_triton = device_time(jit_of(pp_spec.PREFIX_PREFILL)) if kernel is not pp_spec.PREFIX_PREFILL else None

        fn, why = sdpa_flash(dense, window, q_heads, kv_heads)
        t_sdpa = device_time(fn) if fn else float("nan")
        variant = f"{axes['dtype']},{axes['kv']},{axes['scales']},d{HEAD_DIM},{layout}"
        shape = f"{name} h{q_heads}/{kv_heads}"
        timed = ((provider, t_aot), ("jit", t_jit), ("sdpa_flash", t_sdpa))
        if t_triton is not None:
            variant += ",gluon"
            timed += (("jit_triton_kernel", t_triton),)
        for prov, t in timed:
            if t == t:
                rows.add("prefix_prefill", variant, prov, shape, "tflops", flops / t / 1e12)
                rows.add("prefix_prefill", variant, prov, shape, "ms", t * 1e3)
        rows.add("prefix_prefill", variant, provider, shape, "cache_bytes", nbytes)
        ratio = t_aot / t_sdpa if fn else float("nan")
        saved = f"{nbytes / bf16_bytes:8.3f}" if ctx else f"{'-':>8s}"
        triton_ratio = f"{t_triton / t_sdpa:7.2f}" if t_triton is not None and fn else f"{'-':>7s}"
        print(f"{name:42s} {flops / t_aot / 1e12:9.1f} {flops / t_jit / 1e12:9.1f} "
              f"{flops / t_sdpa / 1e12 if fn else float('nan'):10.1f} {ratio:7.2f} {nbytes / 2**20:9.1f} {saved} "
              f"{triton_ratio}"
              + (f"  [{provider}]" if provider != "aot" else "") + (f"  sdpa: {why}" if why else ""))
        del paged, dense, out, args
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
