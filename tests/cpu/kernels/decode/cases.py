"""Random decode problems for the CPU (interpreter) and GPU tests, and the comparison they share."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from aotc.kernels.decode import reference as R

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


@dataclass
class Case:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    table: torch.Tensor
    seq_lens: torch.Tensor
    k_real: torch.Tensor  # float32 [pages, page_size, kv_heads, head_dim]: what the cache holds
    v_real: torch.Tensor
    kwargs: dict = field(default_factory=dict)  # k_scale, v_scale, kv_format, req_idx

    def reference(self, **extra):
        kw = {k: v for k, v in {**self.kwargs, **extra}.items()
              if k in ("req_idx", "sm_scale", "window", "sinks", "return_lse")}
        return R.decode_reference(self.q, self.k_real, self.v_real, self.table, self.seq_lens, **kw)


def zeros(shape, dtype, device, head_major=False):
    """Zeros [pages, page_size, kv_heads, dim]; head_major: stored [pages, kv_heads, page_size, dim]
    and returned as the transposed view (the layout decode and store_kv take either way)."""
    if not head_major:
        return torch.zeros(shape, dtype=dtype, device=device)
    pages, page_size, kv_heads, dim = shape
    return torch.zeros(pages, kv_heads, page_size, dim, dtype=dtype, device=device).transpose(1, 2)


def empty_cache(fmt, pages, page_size, kv_heads, head_dim, device, q_dtype, head_major=False):
    shape = (pages, page_size, kv_heads, head_dim // 2 if fmt == "int4" else head_dim)
    dtype = {"int8": torch.int8, "int4": torch.uint8, **FP8}.get(fmt, DTYPES.get(fmt, q_dtype))
    return zeros(shape, dtype, device, head_major), zeros(shape, dtype, device, head_major)


def make_case(lens, *, fmt="bf16", q_dtype=None, kv_heads=2, group=4, head_dim=64, page_size=16,
              quant_group=32, scale_dtype="fp16", fp8_scale="per_head", extra_pages=3, req_idx=False,
              token_level=False, head_major=False, scale_layout="group", device="cpu", seed=0) -> Case:
    """A batch with lengths `lens`, pages in random order, the cache written by store_kv.
    head_major: caches and scales stored [pages, kv_heads, page_size, dim], passed as views.
    scale_layout "channel" (int8): fp32 scales [kv_heads, head_dim], different for every head and
    channel (absmax of 2-6 standard deviations / 127), K and V quantized against them."""
    from aotc.loader.ops.store_kv import store_kv

    g = torch.Generator(device).manual_seed(seed)  # drawn where the test runs: 16K x 32 on a GPU
    q_dtype = q_dtype or (DTYPES[fmt] if fmt in ("fp16", "bf16") else torch.bfloat16)
    if token_level:
        page_size = 1
    batch = len(lens)
    max_pages = max(1, max(-(-n // page_size) for n in lens))
    pages = batch * max_pages + extra_pages
    # Distinct pages per request in random order; with req_idx, requests sit in shuffled rows of a
    # larger table whose other rows point at pages too.
    perm = torch.randperm(pages, generator=g, device=device)
    own = perm[: batch * max_pages].view(batch, max_pages)
    rows = batch + 2 if req_idx else batch
    order = torch.randperm(rows, generator=g, device=device)[:batch] if req_idx else torch.arange(batch, device=device)
    table = torch.randint(0, pages, (rows, max_pages), generator=g, device=device)
    table[order] = own
    table = table.to(torch.int32)

    k_cache, v_cache = empty_cache(fmt, pages, page_size, kv_heads, head_dim, device, q_dtype, head_major)
    kwargs = {}
    if scale_layout == "channel":
        for key in ("k_scale", "v_scale"):
            kwargs[key] = (2.0 + 4.0 * torch.rand(kv_heads, head_dim, generator=g, device=device)) / 127
        kwargs["scale_layout"] = "channel"
    elif fmt in ("int8", "int4"):
        sshape = (pages, page_size, kv_heads, head_dim // quant_group)
        kwargs["k_scale"] = zeros(sshape, DTYPES[scale_dtype], device, head_major)
        kwargs["v_scale"] = zeros(sshape, DTYPES[scale_dtype], device, head_major)
    elif fmt in FP8 and fp8_scale is not None:
        if fp8_scale == "per_head":
            kwargs["k_scale"] = 0.5 + torch.rand(kv_heads, generator=g, device=device)
            kwargs["v_scale"] = 0.5 + torch.rand(kv_heads, generator=g, device=device)
        else:
            kwargs["k_scale"] = torch.tensor(0.75, device=device)
            kwargs["v_scale"] = torch.tensor(1.25, device=device)
    k_new = torch.randn(pages * page_size, kv_heads, head_dim, generator=g, device=device).to(q_dtype)
    v_new = torch.randn(pages * page_size, kv_heads, head_dim, generator=g, device=device).to(q_dtype)
    slots = torch.randperm(pages * page_size, generator=g, device=device).to(torch.int32)
    store_kv(k_new, v_new, k_cache, v_cache, slots, **kwargs)

    if scale_layout == "channel":
        k_real = R.dequantize_per_channel(k_cache, kwargs["k_scale"])
        v_real = R.dequantize_per_channel(v_cache, kwargs["v_scale"])
    else:
        k_real = R.dequantize(k_cache, fmt, kwargs.get("k_scale"))
        v_real = R.dequantize(v_cache, fmt, kwargs.get("v_scale"))
    if token_level:
        k_cache, v_cache = k_cache[:, 0], v_cache[:, 0]
        for key in ("k_scale", "v_scale"):
            if fmt in ("int8", "int4") and scale_layout != "channel":
                kwargs[key] = kwargs[key][:, 0]
    if req_idx:
        kwargs["req_idx"] = order.to(torch.int32)
    q = torch.randn(batch, kv_heads * group, head_dim, generator=g, device=device).to(q_dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    return Case(q, k_cache, v_cache, table, seq_lens, k_real, v_real, kwargs)


def assert_close(out: torch.Tensor, ref: torch.Tensor, what: str = "") -> None:
    """bf16/fp16 output vs float32 reference: every element within tol + tol * |ref| and the
    relative Frobenius error under rel_tol; bf16: 2e-2 and 1e-2, fp16: 5e-3 and 3e-3."""
    tol, rel_tol = (2e-2, 1e-2) if out.dtype == torch.bfloat16 else (5e-3, 3e-3)
    out, ref = out.float().cpu(), ref.cpu()
    assert not out.isnan().any(), f"{what}: NaN in output"
    err = (out - ref).abs()
    bound = tol + tol * ref.abs()
    worst = int((err - bound).flatten().argmax())
    assert (err <= bound).all(), f"{what}: max error {err.max():.4g} (at flat index {worst}, ref {ref.flatten()[worst]:.4g})"
    rel = (out - ref).norm() / ref.norm().clamp_min(1e-6)
    assert rel < rel_tol, f"{what}: relative error {rel:.4g}"
