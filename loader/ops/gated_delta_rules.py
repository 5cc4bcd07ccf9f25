"""The argument checks gated delta's decode and chunked prefill share (`check_*`, `Dims`): they
take an `op` name for their messages and accept [1, total_T, ...] varlen inputs as well as
[B, T, ...] ones. Each op file (gated_delta.py: the decode; gated_delta_prefill.py) adds its own."""
from __future__ import annotations

import math

import torch

from aotc.kernels.gated_delta import spec as S

from . import rules

QKV_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
GATE_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
LAYOUTS = S.LAYOUTS


class Dims:
    """The sizes every gated-delta argument is checked against: B rows (1 for varlen) of T
    tokens (total_T for varlen), H query/key heads of size K, HV value heads of size V."""

    __slots__ = ("B", "T", "H", "K", "HV", "V")

    def __init__(self, B, T, H, K, HV, V):
        self.B, self.T, self.H, self.K, self.HV, self.V = B, T, H, K, HV, V

    def __repr__(self):
        return f"Dims(B={self.B}, T={self.T}, H={self.H}, K={self.K}, HV={self.HV}, V={self.V})"


def check_qkv(q, k, v, op, max_t=None, max_k=S.MAX_K, max_v=S.MAX_V, min_t=1) -> Dims:
    """q, k [B, T, H, K] and v [B, T, HV, V] (varlen: B = 1, T = total tokens): fp16/bf16/fp32
    alike, last dims contiguous, K in [1, max_k], V in [1, max_v], HV a multiple of H, T >= min_t
    (<= max_t). The defaults are the decode kernel's."""
    rules.tensor(op, "q", q, QKV_DTYPES, 4, int32_strides=True)
    dev = q.device
    rules.tensor(op, "k", k, (q.dtype,), 4, dev, int32_strides=True)
    rules.tensor(op, "v", v, (q.dtype,), 4, dev, int32_strides=True)
    B, T, H, K = q.shape
    if not 1 <= K <= max_k:
        rules.fail(op, "q.shape[3] (K)", f"in [1, {max_k}]", K)
    if T < min_t or (max_t is not None and T > max_t):
        rules.fail(op, "q.shape[1] (T, tokens a row)", f"in [{min_t}, {max_t}]" if max_t else f">= {min_t}", T)
    if tuple(k.shape) != tuple(q.shape):
        rules.fail(op, "k", f"shaped like q {tuple(q.shape)}", tuple(k.shape))
    if tuple(v.shape[:2]) != (B, T):
        rules.fail(op, "v", f"[{B}, {T}, HV, V] (q's first two dims)", tuple(v.shape))
    HV, V = v.shape[2], v.shape[3]
    if H < 1 or HV < 1 or HV % H:
        rules.fail(op, "v.shape[2] (HV, value heads)", f"a positive multiple of H = {H}", HV)
    if not 1 <= V <= max_v:
        rules.fail(op, "v.shape[3] (V)", f"in [1, {max_v}]", V)
    for name, t in (("q", q), ("k", k), ("v", v)):
        rules.unit_last(op, name, t)
    return Dims(B, T, H, K, HV, V)


def _gate_kind(t, name, op, d: Dims, per_k_shape) -> str:
    if tuple(t.shape) == (d.B, d.T, d.HV):
        return "gdn"
    if tuple(t.shape) == (d.B, d.T, d.HV, d.K):
        return "kda"
    rules.fail(op, name, f"[{d.B}, {d.T}, {d.HV}] (GDN) or {list(per_k_shape)} (KDA)", tuple(t.shape))


def check_gates(g, beta, d: Dims, device, op) -> str:
    """g [B, T, HV] (GDN) or [B, T, HV, K] (KDA), log-space; beta [B, T, HV]; fp32/fp16/bf16,
    any strides. Returns "gdn" or "kda"."""
    rules.tensor(op, "g", g, GATE_DTYPES, device=device, int32_strides=True)
    rules.tensor(op, "beta", beta, GATE_DTYPES, 3, device, int32_strides=True)
    kind = _gate_kind(g, "g", op, d, (d.B, d.T, d.HV, d.K))
    if tuple(beta.shape) != (d.B, d.T, d.HV):
        rules.fail(op, "beta", f"[{d.B}, {d.T}, {d.HV}]", tuple(beta.shape))
    return kind


def check_fused_gate(A_log, a, dt_bias, b, d: Dims, device, op) -> str:
    """The fused-gate form (g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)):
    A_log [HV] contiguous; a [B, T, HV] with dt_bias [HV] (GDN), or a [B, T, HV, K] with
    dt_bias [HV, K] (KDA); b [B, T, HV]; fp32/fp16/bf16 each. Returns "gdn" or "kda"."""
    for name, t in (("A_log", A_log), ("a", a), ("dt_bias", dt_bias), ("b", b)):
        if t is None:
            raise ValueError(f"{op}: the fused-gate form needs A_log, a, dt_bias and b; {name} is None")
        rules.tensor(op, name, t, GATE_DTYPES, device=device, int32_strides=True)
    kind = _gate_kind(a, "a", op, d, (d.B, d.T, d.HV, d.K))
    if tuple(A_log.shape) != (d.HV,) or (d.HV > 1 and A_log.stride(0) != 1):
        rules.fail(op, "A_log", f"a contiguous [{d.HV}] tensor", f"shape {tuple(A_log.shape)} strides {A_log.stride()}")
    want = (d.HV,) if kind == "gdn" else (d.HV, d.K)
    if tuple(dt_bias.shape) != want:
        rules.fail(op, "dt_bias", f"{list(want)} (a is {kind.upper()}: {tuple(a.shape)})", tuple(dt_bias.shape))
    if tuple(b.shape) != (d.B, d.T, d.HV):
        rules.fail(op, "b", f"[{d.B}, {d.T}, {d.HV}]", tuple(b.shape))
    return kind


def resolve_gates(g, beta, A_log, a, dt_bias, b, d: Dims, device, op) -> tuple[str, bool]:
    """Which gate form a call uses, checked: (kind "gdn"/"kda", fused)."""
    fused_args = {"A_log": A_log, "a": a, "dt_bias": dt_bias, "b": b}
    if g is None and beta is None and any(t is not None for t in fused_args.values()):
        return check_fused_gate(A_log, a, dt_bias, b, d, device, op), True
    given = [n for n, t in fused_args.items() if t is not None]
    if given:
        raise ValueError(f"{op}: pass either g and beta, or A_log, a, dt_bias and b (the fused-gate form) with "
                         f"g=None and beta=None; got g/beta and {', '.join(given)}")
    if g is None or beta is None:
        raise ValueError(f"{op}: g and beta are required (or A_log, a, dt_bias and b with g=None, beta=None)")
    return check_gates(g, beta, d, device, op), False


def check_state(state, state_layout, d: Dims, device, op) -> str:
    """The fp32 state pool: [slots, HV, V, K] ("vmajor", the default) or [slots, HV, K, V]
    ("kmajor"), the layout named explicitly (K == V cannot tell them apart), last dim contiguous."""
    if state_layout not in LAYOUTS:
        raise ValueError(f"{op}: state_layout must be one of {LAYOUTS}, got {state_layout!r}")
    rules.tensor(op, "state", state, (torch.float32,), 4, device, int32_strides=True)
    inner = (d.V, d.K) if state_layout == "vmajor" else (d.K, d.V)
    if tuple(state.shape[1:]) != (d.HV, *inner):
        what = "[slots, HV, V, K]" if state_layout == "vmajor" else "[slots, HV, K, V]"
        rules.fail(op, "state", f"{what} = [slots, {d.HV}, {inner[0]}, {inner[1]}] for state_layout={state_layout!r}",
              tuple(state.shape))
    rules.unit_last(op, "state", state)
    return state_layout


def check_state_indices(state_indices, n, device, op) -> None:
    """int32 [n], contiguous: row/sequence i uses state slot state_indices[i] (< 0: padded)."""
    rules.tensor(op, "state_indices", state_indices, (torch.int32,), 1, device, int32_strides=True)
    if state_indices.shape[0] != n or (n > 1 and state_indices.stride(0) != 1):
        rules.fail(op, "state_indices", f"a contiguous [{n}] tensor", f"shape {tuple(state_indices.shape)} "
              f"strides {state_indices.stride()}")


def check_state_index_values(state_indices, slots, op) -> None:
    """Values (copied to the host: one device sync): each index < slots, no slot twice (two rows
    updating one state at once would race). Negative indices are padded rows, any number of them."""
    idx = state_indices.cpu().long()
    bad = (idx >= slots).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise ValueError(f"{op}: state_indices[{i}] = {int(idx[i])} is past the pool's {slots} slots")
    used = idx[idx >= 0]
    if used.numel() != used.unique().numel():
        vals, counts = used.unique(return_counts=True)
        slot = int(vals[counts > 1][0])
        rows = (idx == slot).nonzero().flatten().tolist()[:2]
        raise ValueError(f"{op}: state_indices names slot {slot} twice (rows {rows[0]} and {rows[1]}); each slot "
                         f"may be updated by one row a call")


def check_out(out, shape, dtype, device, op) -> None:
    rules.tensor(op, "out", out, (dtype,), len(shape), device, int32_strides=True)
    if tuple(out.shape) != tuple(shape):
        rules.fail(op, "out", f"of shape {tuple(shape)}", tuple(out.shape))
    rules.unit_last(op, "out", out)


def check_scale(scale, K, op) -> float:
    if scale is None:
        return K ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"{op}: scale must be a finite float or None (1/sqrt(K)), got {scale!r}")
    return float(scale)
