"""Inputs for the chunked gated delta rule tests (CPU and GPU): packed varlen batches at realistic
magnitudes, the pool poisoned where no sequence may touch it, and the comparison with its tolerance."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from aotc.kernels.gated_delta.reference import l2norm

# Max |got - want| over max |want| of the whole output (or state), per input dtype: W, U, the
# chunk's attention and the state tile reach the dots in the input dtype (as in fla), so the
# error is a few units of its rounding. Measured on the CPU interpreter (bf16 up to ~6e-3, fp16
# ~1e-3 at T <= 200); the GPU adds tf32 rounding in the precompute.
# fp32 inputs: nothing is rounded to 16 bits (fp32 workspace; tf32x3 dots on the GPU), so only
# summation order and exp/log differ from the reference.
TOL = {torch.float16: 5e-3, torch.bfloat16: 2.5e-2, torch.float32: 2e-4}


def make_case(lengths, *, H=1, HV=2, K=64, V=64, dtype=torch.bfloat16, kda=False, l2norm_in_kernel=True,
              padded=(), slots=None, state_layout="vmajor", strong_gates=False, device="cpu", seed=0):
    """A packed batch: q, k [1, T, H, K], v [1, T, HV, V], g, beta, a pool with distinct random
    slots (NaN in the slots no sequence uses), state_indices (-1 at `padded`), cu_seqlens."""
    gen = torch.Generator().manual_seed(seed)
    T, N = sum(lengths), len(lengths)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    q = randn(1, T, H, K)
    k = randn(1, T, H, K)
    if not l2norm_in_kernel:  # without the in-kernel norm the delta rule needs unit keys to stay bounded
        q, k = l2norm(q), l2norm(k)
    v = randn(1, T, HV, V)
    # SGLang's gates: g = -exp(A_log) * softplus(a + dt_bias), A_log = log(U(1, 16)) (strong) or
    # log(U(0.5, 4)) (typical), beta = sigmoid(b).
    lo, hi = (1.0, 16.0) if strong_gates else (0.5, 4.0)
    gshape = (1, T, HV, K) if kda else (1, T, HV)
    a_log = torch.log(torch.rand(HV, generator=gen) * (hi - lo) + lo)
    decay = a_log.exp().view(-1, 1) if kda else a_log.exp()
    g = -decay * F.softplus(randn(*gshape) - 2.0)
    beta = torch.sigmoid(randn(1, T, HV))
    slots = slots or N + 3
    perm = torch.randperm(slots, generator=gen)[:N]
    idx = perm.clone()
    for p in padded:
        idx[p] = -1
    inner = (V, K) if state_layout == "vmajor" else (K, V)
    state = torch.full((slots, HV) + inner, float("nan"))
    state[perm] = randn(N, HV, *inner) * 0.5
    cu = torch.tensor([0] + list(torch.cumsum(torch.tensor(lengths), 0)), dtype=torch.int32)
    case = {"q": q.to(dtype), "k": k.to(dtype), "v": v.to(dtype), "g": g, "beta": beta, "state": state,
            "state_indices": idx.to(torch.int32), "cu_seqlens": cu}
    return {n: t.to(device) for n, t in case.items()}


def rel_err(got, want) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6))


def assert_close(got, want, dtype, what):
    err = rel_err(got, want)
    assert err <= TOL[dtype], f"{what}: max abs error / max |want| = {err:.2e} > {TOL[dtype]:.0e}"
