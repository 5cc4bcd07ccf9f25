"""Random gated-delta decode problems, shared by the CPU and GPU tests.

Inputs at the scales a model produces: q/k/v ~ randn in the input dtype; the gate from SGLang's
fused form with A_log = log(U(1, 16)), a ~ randn, dt_bias ~ randn (so g = -exp(A_log) *
softplus(a + dt_bias) spans about -0.01 .. -70), beta = sigmoid(b ~ randn); pool states ~ randn
* 0.5. Without the in-kernel L2 norm, k arrives normalized (as models normalize it before the
kernel): an unnormalized key makes the delta rule's update grow by |1 - beta |k|^2| a token.
The pool holds more slots than rows; rows point at a random subset, some rows are padded (-1),
and the slots no row names must come back bit for bit.
"""
from __future__ import annotations

import torch

from aotc.kernels.gated_delta.reference import fused_gate, gated_delta_reference, l2norm

# |got - ref| <= ATOL + RTOL * |ref|, element by element, against the float32 reference fed the
# kernel's own (rounded) inputs. State: fp32 in both, differing in summation order and exp/log
# implementations (the GPU's are approximate to ~2^-22). Out: the kernel rounds o to the input
# dtype (half an ulp: 2^-9 bf16, 2^-12 fp16) on top of that.
STATE_TOL = (2e-4, 2e-4)  # (atol, rtol)
# fp32 q/k/v: the output is not rounded either, so it gets the state's tolerance.
OUT_TOL = {torch.bfloat16: (2e-3, 8e-3), torch.float16: (1e-3, 1.5e-3), torch.float32: STATE_TOL}


def make_case(B=3, T=2, H=1, HV=2, K=64, V=64, *, dtype=torch.bfloat16, kda=False, fused=False, qk_l2norm=False,
              layout="vmajor", pads=(1,), slots=None, gate_dtype=torch.float32, device="cpu", seed=0):
    """(args, kw): the op's positional arguments as a dict and its keywords."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    q = randn(B, T, H, K)
    k = randn(B, T, H, K)
    if not qk_l2norm:
        k = l2norm(k)
    q, k, v = q.to(dtype), k.to(dtype), randn(B, T, HV, V).to(dtype)
    gate_shape = (B, T, HV, K) if kda else (B, T, HV)
    A_log = torch.log(torch.rand(HV, generator=gen) * 15 + 1)
    a = randn(*gate_shape).to(gate_dtype)
    dt_bias = randn(*((HV, K) if kda else (HV,))).to(gate_dtype)
    b = randn(B, T, HV).to(gate_dtype)
    slots = slots or 2 * B + 3
    state = randn(slots, HV, *((V, K) if layout == "vmajor" else (K, V))) * 0.5
    idx = torch.randperm(slots, generator=gen)[:B].to(torch.int32)
    for p in pads:
        if p < B:
            idx[p] = -1
    args = dict(q=q, k=k, v=v, state=state, state_indices=idx)
    kw = dict(qk_l2norm=qk_l2norm, state_layout=layout)
    if fused:
        args.update(g=None, beta=None)
        kw.update(A_log=A_log, a=a, dt_bias=dt_bias, b=b)
    else:
        g, beta = fused_gate(A_log, a, dt_bias, b)
        args.update(g=g.to(gate_dtype), beta=beta.to(gate_dtype))
    return {n: (t.to(device) if isinstance(t, torch.Tensor) else t) for n, t in args.items()}, \
        {n: (t.to(device) if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}


def reference(args, kw, scale=None):
    """The float32 reference's (out, pool) for a case, computed where the case's tensors are. On a GPU
    that is the GPU: on the H100 machine's CPU the per-token loop at K = 256 (256 KiB states) ran for
    minutes beside other test processes, against about a second alone (tests/gpu/test_gated_delta.py)."""
    g, beta = args["g"], args["beta"]
    if g is None:
        g, beta = fused_gate(kw["A_log"], kw["a"], kw["dt_bias"], kw["b"])
    return gated_delta_reference(args["q"], args["k"], args["v"], g, beta, args["state"], args["state_indices"],
                                 scale=scale, qk_l2norm=kw["qk_l2norm"], state_layout=kw["state_layout"])


def run(op, args, kw, **extra):
    """Run the op on a copy of the pool with a NaN-poisoned out; returns (out, pool)."""
    a = dict(args, state=args["state"].clone())
    q, v = a["q"], a["v"]
    out = torch.full((*q.shape[:2], *v.shape[2:]), float("nan"), dtype=q.dtype, device=q.device)
    got = op(*[a[n] for n in ("q", "k", "v", "g", "beta", "state", "state_indices")], **kw, **extra, out=out)
    assert got is out
    return out, a["state"]


def assert_close(got, want, tol, what):
    atol, rtol = tol
    got, want = got.float().cpu(), want.float().cpu()
    assert not got.isnan().any(), f"{what}: NaN (an element was not written)"
    err = (got - want).abs()
    bad = err > atol + rtol * want.abs()
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.numel()} elements off, worst {float(err.max()):.3g} "
                           f"at {tuple(bad.nonzero()[0].tolist())} (|ref| max {float(want.abs().max()):.3g})")


def check_case(op, args, kw, scale=None):
    """Run and compare out, the named slots' states, and every other slot bit for bit."""
    out, pool = run(op, args, kw, **({"scale": scale} if scale is not None else {}))
    ref_out, ref_pool = reference(args, kw, scale)
    assert_close(out, ref_out, OUT_TOL[args["q"].dtype], "out")
    idx = args["state_indices"].cpu().long()
    named = idx[idx >= 0]
    assert_close(pool.cpu()[named], ref_pool.cpu()[named], STATE_TOL, "state")
    others = torch.ones(pool.shape[0], dtype=torch.bool)
    others[named] = False
    assert torch.equal(pool.cpu()[others], args["state"].cpu()[others]), "a slot no row names was written"
    pad_rows = (idx < 0).nonzero().flatten()
    assert (out.cpu()[pad_rows] == 0).all(), "a padded row's outputs are not zeros"
    return out, pool
