"""fla's `return_intermediate_states` (chunk_kda, inference only): the state at the start of every chunk.

fla-core 0.6.0 (fla/ops/kda/chunk.py, fla/ops/common/chunk_delta_h.py, read from its wheel) returns
h [B, NT, HV, K, V] ([.., V, K] with state_v_first) in k's dtype, h[:, i] the state before chunk i
of `chunk_size` tokens (h[:, 0] the initial state), NT = ceil(T / chunk_size); with cu_seqlens, B = 1
and NT counts every sequence's chunks, sequence by sequence. aotc's chunked prefill keeps states in
registers and writes only the final one, so this runs the prefill one chunk of every sequence at a
time from the float32 pool, copying the pool's states into h before each step: max NT launches of
the op (a host read of cu_seqlens first), and outputs the same as one call's (the op chunks each
sequence from its start, so a step's chunk is one chunk of the full call; the pool holds the state
in float32 between steps, as the registers did).
"""
from __future__ import annotations

import torch


def run_by_chunk(q, k, v, g, beta, pool, cu_seqlens, chunk, h_dtype, *, scale, qk_l2norm, layout):
    """(o [1, T, HV, V] in q's dtype, h [NT, HV, *pool inner dims] in h_dtype); the pool ([N, HV, ...],
    float32, sequence n in slot n) ends at the final states. q, k, v [1, T, ...], g, beta float32 or
    their own dtypes as the op takes them, cu_seqlens [N + 1] on q's device."""
    from aotc import loader

    dev = q.device
    cu = [int(x) for x in cu_seqlens.tolist()]  # the chunk schedule is built on the host
    n_seq = len(cu) - 1
    nts = [-(-(cu[n + 1] - cu[n]) // chunk) for n in range(n_seq)]
    first = [sum(nts[:n]) for n in range(n_seq)]  # sequence n's chunks start at h[first[n]]
    h = torch.empty((sum(nts), *pool.shape[1:]), dtype=h_dtype, device=dev)
    o = torch.empty((1, q.shape[1], *v.shape[2:]), dtype=q.dtype, device=dev)
    for c in range(max(nts, default=0)):
        active = [n for n in range(n_seq) if nts[n] > c]
        spans = [(cu[n] + c * chunk, min(cu[n] + (c + 1) * chunk, cu[n + 1])) for n in active]
        h[torch.tensor([first[n] + c for n in active], device=dev)] = pool[torch.tensor(active, device=dev)].to(h_dtype)
        tok = torch.cat([torch.arange(a, b) for a, b in spans]).to(dev)
        cu_c = torch.tensor([0] + [b - a for a, b in spans], dtype=torch.int32).cumsum(0, dtype=torch.int32).to(dev)
        slots = torch.tensor(active, dtype=torch.int32, device=dev)
        o[:, tok] = loader.gated_delta_prefill(q[:, tok], k[:, tok], v[:, tok], g[:, tok], beta[:, tok], pool, slots,
                                               cu_c, scale=scale, qk_l2norm=qk_l2norm, state_layout=layout)
    return o, h
