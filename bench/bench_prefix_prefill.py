"""Prefix-prefill throughput: TFLOP/s of aotc (the public op: AOT binary, or its JIT fallback when
not built), the same kernel through Triton's JIT, and torch SDPA's flash backend on the same
attention made contiguous (lower-right causal), side by side.

FLOPs count only allowed (query, key) pairs, 4 * head_dim each (QK^T and PV). Times are medians
of CUDA-event timings, the L2 emptied before each call (harness.device_time). Rows: JSON lines at --out.
"""
from __future__ import annotations

import argparse
import warnings

import torch
import torch.nn.functional as F

from aotc.kernels.prefix_prefill import spec as pp_spec
from aotc.kernels.prefix_prefill.kernel import prefix_prefill_kernel
from aotc.loader.ops import prefix_prefill as pp_op
from harness import Rows, device_time

# (name, batch, context, new tokens, block size, window, cache dtype, layout)
SHAPES = [
    ("b8 ctx2048+512 page16", 8, 2048, 512, 16, None, None, "nhd"),
    ("b8 ctx2048+512 page32", 8, 2048, 512, 32, None, None, "nhd"),
    ("b1 ctx16384+2048 page16", 1, 16384, 2048, 16, None, None, "nhd"),
    ("b1 ctx16384+2048 page32", 1, 16384, 2048, 32, None, None, "nhd"),
    ("b1 ctx16384+2048 page16 window4096", 1, 16384, 2048, 16, 4096, None, "nhd"),
    ("b8 ctx2048+512 page16 fp8e4m3", 8, 2048, 512, 16, None, torch.float8_e4m3fn, "nhd"),
    ("b8 ctx2048+512 page16 vllm-layout", 8, 2048, 512, 16, None, None, "vllm"),
]
Q_HEADS, KV_HEADS, HEAD_DIM, DTYPE = 32, 8, 128, torch.bfloat16


def make(batch, ctx, new, page, cache_dtype, layout):
    """Paged inputs plus the same keys/values contiguous, [batch, heads, seq, D], for SDPA."""
    seq = ctx + new
    dev = "cuda"
    q = torch.randn(batch, new, Q_HEADS, HEAD_DIM, device=dev, dtype=DTYPE)
    keys = torch.randn(batch, seq, KV_HEADS, HEAD_DIM, device=dev, dtype=DTYPE)
    vals = torch.randn(batch, seq, KV_HEADS, HEAD_DIM, device=dev, dtype=DTYPE)
    pages = ctx // page
    table = torch.randperm(batch * pages, device=dev, dtype=torch.int32).view(batch, pages)
    kw = {"kv_layout": layout}
    kc = torch.empty(batch * pages, page, KV_HEADS, HEAD_DIM, device=dev, dtype=DTYPE)
    vc = torch.empty_like(kc)
    kc[table.long()] = keys[:, :ctx].reshape(batch, pages, page, KV_HEADS, HEAD_DIM)
    vc[table.long()] = vals[:, :ctx].reshape(batch, pages, page, KV_HEADS, HEAD_DIM)
    if cache_dtype is not None:  # the contiguous copy gets the dequantized values SDPA would see
        scale = torch.tensor([0.05], device=dev)
        kc, vc = (kc.float() / scale).to(cache_dtype), (vc.float() / scale).to(cache_dtype)
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
    return paged, kw, dense


def pairs(batch, ctx, new, window):
    pos = torch.arange(ctx, ctx + new, dtype=torch.float64) + 1  # keys visible to each query
    return batch * float((pos.clamp(max=window) if window else pos).sum())


def sdpa_flash(dense, window):
    """The SDPA flash call (or None with a reason) for lower-right causal attention."""
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = Rows(a.out)
    arch = torch.cuda.get_device_capability()[0] * 10 + torch.cuda.get_device_capability()[1]
    fallback = set()  # variants whose first call warned that no binary was built
    print(f"{'shape':38s} {'aot TF/s':>9s} {'jit TF/s':>9s} {'sdpa TF/s':>10s} {'aot/sdpa':>9s}")
    for name, batch, ctx, new, page, window, cache_dtype, layout in SHAPES:
        paged, kw, dense = make(batch, ctx, new, page, cache_dtype, layout)
        flops = 4 * HEAD_DIM * Q_HEADS * pairs(batch, ctx, new, window)
        out = torch.empty_like(paged[0])
        call = dict(kw, window=window, out=out, validate=False)  # no per-call sync in the timed loop
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pp_op.prefix_prefill(*paged, **call)
        axes = pp_op.launch_plan(*paged, out, layout, kw.get("k_scale"), kw.get("v_scale"), HEAD_DIM ** -0.5,
                                 window, None, None, False)[0]
        if any("not built" in str(w.message) for w in caught):
            fallback.add(str(axes))
        provider = "aot_jit_fallback" if str(axes) in fallback else "aot"
        t_aot = device_time(lambda: pp_op.prefix_prefill(*paged, **call))

        axes, grid, args = pp_op.launch_plan(*paged, out, layout, kw.get("k_scale"), kw.get("v_scale"),
                                             HEAD_DIM ** -0.5, window, None, None, False)
        cfg = pp_spec.launch(axes, arch)
        cx = pp_spec.constexprs(axes)

        def jit():
            prefix_prefill_kernel[grid](*args, **cx, **cfg.triton_options())
        t_jit = device_time(jit)

        fn, why = sdpa_flash(dense, window)
        t_sdpa = device_time(fn) if fn else float("nan")
        variant = f"{axes['dtype']},{axes['kv']},d{HEAD_DIM},{layout}"
        shape = f"{name} h{Q_HEADS}/{KV_HEADS}"
        for prov, t in ((provider, t_aot), ("jit", t_jit), ("sdpa_flash", t_sdpa)):
            if t == t:
                rows.add("prefix_prefill", variant, prov, shape, "tflops", flops / t / 1e12)
                rows.add("prefix_prefill", variant, prov, shape, "ms", t * 1e3)
        ratio = t_sdpa / t_aot if fn else float("nan")
        print(f"{name:38s} {flops / t_aot / 1e12:9.1f} {flops / t_jit / 1e12:9.1f} "
              f"{flops / t_sdpa / 1e12 if fn else float('nan'):10.1f} {ratio:9.2f}"
              + (f"  [{provider}]" if provider != "aot" else "") + (f"  sdpa: {why}" if why else ""))
        del paged, dense, out, args
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
