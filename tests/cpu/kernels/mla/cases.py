"""Random MLA / unequal-head decode problems for the CPU (interpreter) and GPU tests."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from aotc.kernels.decode.reference import decode_reference

FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


@dataclass
class Case:
    q: torch.Tensor
    k_cache: torch.Tensor  # the latent cache when latent
    v_cache: torch.Tensor  # latent: k_cache[..., :d_v]
    table: torch.Tensor
    seq_lens: torch.Tensor
    k_real: torch.Tensor  # float32: what the caches hold
    v_real: torch.Tensor
    kwargs: dict = field(default_factory=dict)  # k_scale, v_scale

    def reference(self, **kw):
        return decode_reference(self.q, self.k_real, self.v_real, self.table, self.seq_lens, **kw)


def make_case(lens, *, d_qk=576, d_v=512, latent=True, fmt="bf16", kv_heads=1, group=16, page_size=16,
              extra_pages=3, device="cpu", seed=0) -> Case:
    """A batch with lengths `lens`, pages in random order, caches of unit-normal values (fp8: scaled
    so the largest element is near e4m3's 448, one scale a cache)."""
    g = torch.Generator(device).manual_seed(seed)
    q_dtype = torch.float16 if fmt == "fp16" else torch.bfloat16
    batch = len(lens)
    max_pages = max(1, max(-(-n // page_size) for n in lens))
    pages = batch * max_pages + extra_pages
    table = torch.randperm(pages, generator=g, device=device)[: batch * max_pages].view(batch, max_pages)
    table = table.to(torch.int32)
    k = torch.randn(pages, page_size, kv_heads, d_qk, generator=g, device=device)
    v = k[..., :d_v] if latent else torch.randn(pages, page_size, kv_heads, d_v, generator=g, device=device)
    kwargs = {}
    if fmt in FP8:
        ks = torch.tensor([k.abs().max() / 400.0], device=device)
        vs = ks if latent else torch.tensor([v.abs().max() / 400.0], device=device)
        k_cache = (k / ks).to(FP8[fmt])
        v_cache = k_cache[..., :d_v] if latent else (v / vs).to(FP8[fmt])
        kwargs = {"k_scale": ks} if latent else {"k_scale": ks, "v_scale": vs}
        k_real, v_real = k_cache.float() * ks, v_cache.float() * vs
    else:
        k_cache = k.to(q_dtype)
        v_cache = k_cache[..., :d_v] if latent else v.to(q_dtype)
        k_real, v_real = k_cache.float(), v_cache.float()
    q = torch.randn(batch, kv_heads * group, d_qk, generator=g, device=device).to(q_dtype)
    seq = torch.tensor(lens, dtype=torch.int32, device=device)
    return Case(q, k_cache, v_cache, table, seq, k_real, v_real, kwargs)


def assert_close(out: torch.Tensor, ref: torch.Tensor, what: str = "") -> None:
    """bf16/fp16 output vs float32 reference: every element within tol + tol * |ref| and the
    relative Frobenius error under rel_tol; bf16: 2e-2 and 1e-2, fp16: 5e-3 and 3e-3. (fp8 caches:
    the reference reads the same fp8 values, so the same bounds hold.)"""
    tol, rel_tol = (2e-2, 1e-2) if out.dtype == torch.bfloat16 else (5e-3, 3e-3)
    out, ref = out.float().cpu(), ref.cpu()
    assert not out.isnan().any(), f"{what}: NaN in output"
    err = (out - ref).abs()
    bound = tol + tol * ref.abs()
    worst = int((err - bound).flatten().argmax())
    assert (err <= bound).all(), f"{what}: max error {err.max():.4g} (at {worst}, ref {ref.flatten()[worst]:.4g})"
    rel = (out - ref).norm() / ref.norm().clamp_min(1e-6)
    assert rel < rel_tol, f"{what}: relative error {rel:.4g}"


def assert_lse_close(lse: torch.Tensor, ref: torch.Tensor) -> None:
    """Natural-log LSE within 2e-3 + 1e-3 |ref|; -inf exactly where the reference has it."""
    lse, ref = lse.float().cpu(), ref.cpu()
    empty = ref == float("-inf")
    assert torch.equal(lse == float("-inf"), empty)
    assert ((lse[~empty] - ref[~empty]).abs() <= 2e-3 + 1e-3 * ref[~empty].abs()).all()
