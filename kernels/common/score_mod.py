"""vLLM's score modifiers, shared by prefix prefill and decode: softcap, then ALiBi (linear or
vLLM's sqrt form), applied to natural-log scores. Their values are runtime arguments; a kernel
reads them only in its score-mod binaries (each family's `score` axis)."""
import triton
import triton.language as tl


@triton.jit
def _score_mod(s, rel_q, rel_k, softcap, slope, alibi_mode):
    """Natural-log scores s [ROWS, BLOCK_N] capped to softcap * tanh(s / softcap) (softcap > 0),
    then ALiBi's bias added (vLLM's order): alibi_mode 1 slope * rel_k, 2 -slope * sqrt(rel_q -
    rel_k) for keys at or before the query (slope is 0 with alibi_mode 0). rel_q [ROWS] / rel_k
    [BLOCK_N]: query / key positions less the context length; slope a scalar or [ROWS, 1]. Selects,
    not branches: a branch on a tile costs shared memory (prefix_prefill/spec.py, the score axis)."""
    cap = tl.where(softcap > 0, softcap, 1.0)
    # tanh(y) = 1 - 2 / (exp(2y) + 1): saturates at +-1 where exp overflows (never inf / inf)
    s = tl.where(softcap > 0, cap * (1.0 - 2.0 / (tl.exp(2.0 * s / cap) + 1.0)), s)
    dist = (rel_q[:, None] - rel_k[None, :]).to(tl.float32)
    bias = tl.where(alibi_mode == 2, -tl.sqrt(tl.maximum(dist, 0.0)), rel_k[None, :].to(tl.float32))
    return s + slope * bias
