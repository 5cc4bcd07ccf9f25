"""KDA's precompute kernels (kda_chunk.py) on the Triton interpreter, each output against float64
torch: kda_chunk_intra's diagonal 16 x 16 blocks and kda_chunk_inter's blocks below them, together
A (strictly lower, beta, 1 / |k|) and Aqk (lower with the diagonal, scale, 1 / |q|, 1 / |k|, zeros
above), and kda_chunk_inter's Qg, Kg, W operand, decays, Fq; kda_chunk_wy's W = X (W operand) and
U = X (beta v) with X = (I + A)^-1. Sequences of 1, 15, 16, 17, 33, 64 and 70 tokens put rows on every side of the
16-token block and 64-token chunk boundaries; strong gates (SGLang's strong range, and ten times
it: thousands a chunk) make any unsplit decay overflow. Workspaces are NaN-poisoned first: every
element a later kernel reads must be written. Tolerances: max abs error over max |want| per output
(bf16 operands in the across-block dots and the W/U dots, bf16 workspaces).
"""
import pytest
import torch

from aotc.loader.dispatch import run_kernel
from aotc.loader.ops.gated_delta_prefill import launch_plan

from .chunk_cases import make_case

LENGTHS = [1, 15, 16, 17, 33, 64, 70]
CHUNK = 64


def _rel(got, want):
    return float((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30))


def _expected(c, scale):
    """Per chunk, float64: A, Aqk, X [T, HV, 64], Qg, Kg, the W operand [T, HV, K], the decay by
    (sequence, first token)."""
    q, k = c["q"][0].double(), c["k"][0].double()
    v, g, beta = c["v"][0].double(), c["g"][0].double(), c["beta"][0].double()
    T, H, K = q.shape
    HV = v.shape[1]
    rep = HV // H
    q = q / (q.square().sum(-1, keepdim=True) + 1e-6).sqrt()
    k = k / (k.square().sum(-1, keepdim=True) + 1e-6).sqrt()
    q, k = q.repeat_interleave(rep, 1), k.repeat_interleave(rep, 1)
    want = {n: torch.zeros(T, HV, CHUNK, dtype=torch.float64) for n in ("A", "Aqk", "X")}
    for n in ("Qg", "Kg", "W"):
        want[n] = torch.zeros(T, HV, K, dtype=torch.float64)
    decays = {}
    cu = c["cu_seqlens"].tolist()
    for s in range(len(cu) - 1):
        for t0 in range(cu[s], cu[s + 1], CHUNK):
            t1 = min(t0 + CHUNK, cu[s + 1])
            n = t1 - t0
            G = g[t0:t1].cumsum(0)  # [n, HV, K]
            d = (G[:, None] - G[None, :]).clamp_max(0)  # [r, c, HV, K]; r >= c only used
            lower = torch.tril(torch.ones(n, n, dtype=torch.bool))
            e = torch.where(lower[:, :, None, None], d.exp(), torch.zeros((), dtype=torch.float64))
            a = torch.einsum("rhk,chk,rchk->hrc", k[t0:t1], k[t0:t1], e) * beta[t0:t1].T[:, :, None]
            a = a * torch.tril(torch.ones(n, n, dtype=torch.float64), -1)
            aq = torch.einsum("rhk,chk,rchk->hrc", q[t0:t1], k[t0:t1], e) * scale
            want["A"][t0:t1, :, :n] = a.permute(1, 0, 2)
            want["Aqk"][t0:t1, :, :n] = aq.permute(1, 0, 2)
            want["X"][t0:t1, :, :n] = torch.linalg.inv(torch.eye(n, dtype=torch.float64) + a).permute(1, 0, 2)
            want["Qg"][t0:t1] = q[t0:t1] * G.exp() * scale
            want["Kg"][t0:t1] = k[t0:t1] * (G[-1] - G).exp()
            want["W"][t0:t1] = k[t0:t1] * G.exp() * beta[t0:t1, :, None]
            decays[(s, t0)] = G[-1].exp()
    return want, decays


@pytest.mark.parametrize("dtype,gain", [(torch.bfloat16, 1.0), (torch.float32, 1.0), (torch.bfloat16, 10.0)])
def test_kda_precompute_kernels_against_float64(dtype, gain):
    c = make_case(LENGTHS, H=1, HV=2, K=64, V=64, kda=True, strong_gates=True, dtype=dtype, seed=11)
    c["g"] = c["g"] * gain
    assert c["g"].min() < -10 * gain and c["g"][0, 64:128].sum(0).min() < -100 * gain  # a chunk: hundreds
    scale = 64 ** -0.5
    out = torch.empty(c["v"].shape, dtype=dtype)
    plan = launch_plan(c["q"], c["k"], c["v"], c["g"], c["beta"], c["state"], c["state_indices"], c["cu_seqlens"],
                       out, scale, True, "vmajor")
    assert [p[0].name for p in plan[:3]] == ["kda_chunk_intra", "kda_chunk_inter", "kda_chunk_wy"]
    aqk, akk = plan[0][3][4:6]
    w, qg, fq, kg = plan[1][3][4:8]
    decay = plan[1][3][10]
    u = plan[2][3][4]
    for t in (w, u, qg, fq, kg, aqk, akk, decay):
        t.fill_(float("nan"))
    run_kernel(*plan[0])
    run_kernel(*plan[1])
    want, decays = _expected(c, scale)
    T = c["q"].shape[1]
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    assert not any(t.isnan().any() for t in (akk, aqk, qg, fq, kg, w)), "a workspace element was not written"
    assert _rel(akk, want["A"]) <= tol, "A"
    assert _rel(aqk, want["Aqk"]) <= tol, "Aqk"
    assert torch.equal(fq, torch.ones(T, 2)), "Fq"
    assert _rel(qg, want["Qg"]) <= tol, "Qg"
    assert _rel(kg, want["Kg"]) <= tol, "Kg"
    assert _rel(w, want["W"]) <= tol, "W operand"
    cu = c["cu_seqlens"].tolist()
    for (s, t0), dec in decays.items():
        slot = t0 // CHUNK + s  # the chunk slot of the device schedule (chunk.py)
        assert _rel(decay[slot], dec) <= 1e-5, f"decay of chunk {t0} (sequence {s})"
    run_kernel(*plan[2])
    assert not u.isnan().any() and not w.isnan().any(), "a W / U element was not written"
    x = want["X"]
    v = c["v"][0].double()
    beta = c["beta"][0].double()
    want_w, want_u = torch.zeros_like(want["W"]), torch.zeros(T, 2, 64, dtype=torch.float64)
    for s in range(len(cu) - 1):
        for t0 in range(cu[s], cu[s + 1], CHUNK):
            t1 = min(t0 + CHUNK, cu[s + 1])
            n = t1 - t0
            xs = x[t0:t1, :, :n].permute(1, 0, 2)  # [HV, n, n]
            want_w[t0:t1] = torch.einsum("hrc,chk->rhk", xs, want["W"][t0:t1])
            want_u[t0:t1] = torch.einsum("hrc,chk->rhk", xs, v[t0:t1] * beta[t0:t1, :, None])
    assert _rel(w, want_w) <= 2 * tol, "W"
    assert _rel(u, want_u) <= 2 * tol, "U"
