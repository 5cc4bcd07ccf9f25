"""Paged prefix-prefill attention (chunked prefill / prefix caching), as `aotc::prefix_prefill`."""
from __future__ import annotations

import math

import torch

from aotc.kernels.prefix_prefill import spec as _spec

from . import library
from .overlap import check_disjoint

_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
_FP8 = {torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2"}
_I32_MAX = 2 ** 31 - 1
_dummies: dict[torch.device, torch.Tensor] = {}


def _dummy_f32(device: torch.device) -> torch.Tensor:
    """Stands in for an absent fp32 pointer (the kernel never reads it: a flag says so)."""
    t = _dummies.get(device)
    if t is None:
        t = _dummies[device] = torch.zeros(1, dtype=torch.float32, device=device)
    return t


def _need(cond: bool, name: str, expected: str, got) -> None:
    if not cond:
        raise ValueError(f"prefix_prefill: {name} must be {expected}, got {got}")


def _tensor(name, t, dtypes, ndim, device=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"prefix_prefill: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"prefix_prefill: {name} must have dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    _need(t.dim() == ndim, name, f"{ndim}-D", f"shape {tuple(t.shape)}")
    if device is not None:
        _need(t.device == device, name, f"on {device} (like q)", t.device)
    _need(t.dim() == 0 or t.stride(-1) == 1 or t.shape[-1] == 1, name, "contiguous in its last dim",
          f"strides {t.stride()}")


def _scalar_f32(name, t, device):
    _tensor(name, t.reshape(-1) if isinstance(t, torch.Tensor) else t, (torch.float32,), 1, device)
    _need(t.numel() == 1, name, "a one-element float32 tensor", f"{t.numel()} elements")


def _validate(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, kv_layout, k_scale,
              v_scale, sm_scale, window, sinks, out_scale, out):
    _tensor("q", q, tuple(_DTYPES), 3)
    dev = q.device
    _tensor("k", k, (q.dtype,), 3, dev)
    _tensor("v", v, (q.dtype,), 3, dev)
    tokens, q_heads, head_dim = q.shape
    _need(head_dim in _spec.HEAD_DIMS, "q.shape[2] (head_dim)", f"one of {_spec.HEAD_DIMS}", head_dim)
    _need(k.shape[0] == tokens and k.shape[2] == head_dim, "k", f"[{tokens}, kv_heads, {head_dim}]",
          tuple(k.shape))
    _need(v.shape == k.shape, "v", f"shaped like k {tuple(k.shape)}", tuple(v.shape))
    kv_heads = k.shape[1]
    _need(kv_heads > 0 and q_heads % kv_heads == 0, "k.shape[1] (kv_heads)", f"a divisor of q_heads={q_heads}",
          kv_heads)
    if kv_layout not in _spec.LAYOUTS:
        raise ValueError(f"prefix_prefill: kv_layout must be one of {_spec.LAYOUTS}, got {kv_layout!r}")
    cache_dtypes = (q.dtype,) + tuple(_FP8)
    _tensor("k_cache", k_cache, cache_dtypes, 4 if kv_layout == "nhd" else 5, dev)
    _tensor("v_cache", v_cache, (k_cache.dtype,), 4, dev)
    nb = k_cache.shape[0]
    if kv_layout == "nhd":
        bs = k_cache.shape[1]
        want = (nb, bs, kv_heads, head_dim)
        _need(tuple(k_cache.shape) == want, "k_cache", f"[num_blocks, block_size, {kv_heads}, {head_dim}]",
              tuple(k_cache.shape))
        _need(tuple(v_cache.shape) == want, "v_cache", f"shaped like k_cache {want}", tuple(v_cache.shape))
    else:
        x = 16 // k_cache.element_size()
        bs = k_cache.shape[3]
        _need(tuple(k_cache.shape) == (nb, kv_heads, head_dim // x, bs, x), "k_cache",
              f"[num_blocks, {kv_heads}, {head_dim // x}, block_size, {x}] (vllm layout)", tuple(k_cache.shape))
        _need(k_cache.stride(3) == x, "k_cache", f"contiguous in its last two dims (stride {x} for dim 3)",
              f"strides {k_cache.stride()}")
        _need(tuple(v_cache.shape) == (nb, kv_heads, head_dim, bs), "v_cache",
              f"[{nb}, {kv_heads}, {head_dim}, {bs}] (vllm layout)", tuple(v_cache.shape))
    _need(bs > 0, "the cache block size", "positive", bs)
    fp8 = k_cache.dtype in _FP8
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if fp8:
            if s is None:
                raise ValueError(f"prefix_prefill: {name} is required for an fp8 cache ({k_cache.dtype})")
            _scalar_f32(name, s, dev)
        elif s is not None:
            raise ValueError(f"prefix_prefill: {name} applies to fp8 caches only; the cache is {k_cache.dtype}")
    _tensor("block_table", block_table, (torch.int32,), 2, dev)
    batch = block_table.shape[0]
    _tensor("query_start_loc", query_start_loc, (torch.int32,), 1, dev)
    _need(query_start_loc.shape[0] == batch + 1, "query_start_loc", f"[batch + 1] = [{batch + 1}] (block_table "
          f"has {batch} rows)", tuple(query_start_loc.shape))
    _tensor("seq_lens", seq_lens, (torch.int32,), 1, dev)
    _need(seq_lens.shape[0] == batch, "seq_lens", f"[batch] = [{batch}]", tuple(seq_lens.shape))
    if sm_scale is not None:
        _need(isinstance(sm_scale, (int, float)) and math.isfinite(sm_scale), "sm_scale", "a finite float", sm_scale)
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, int):
            raise TypeError(f"prefix_prefill: window must be an int or None, got {type(window).__name__}")
        _need(0 <= window <= _I32_MAX, "window", "in [0, 2**31) (0 or None: no window)", window)
    if sinks is not None:
        _tensor("sinks", sinks, (torch.float32,), 1, dev)
        _need(sinks.shape[0] == q_heads, "sinks", f"[q_heads] = [{q_heads}]", tuple(sinks.shape))
    if out_scale is not None:
        _scalar_f32("out_scale", out_scale, dev)
    if out is not None:
        _tensor("out", out, (torch.float8_e4m3fn,) if out_scale is not None else (q.dtype,), 3, dev)
        _need(tuple(out.shape) == tuple(q.shape), "out", f"shaped like q {tuple(q.shape)}", tuple(out.shape))
        # A program writes its rows of out while later programs still read earlier rows of k and v.
        check_disjoint("prefix_prefill", "out", out, {"q": q, "k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache,
                                                      "block_table": block_table, "query_start_loc": query_start_loc,
                                                      "seq_lens": seq_lens, "sinks": sinks})
    for name, t in (("q", q), ("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache), ("out", out),
                    ("block_table", block_table)):
        if t is not None:
            _need(all(0 <= s <= _I32_MAX for s in t.stride()), f"{name}'s strides", "in [0, 2**31)", t.stride())
    _need(tokens < _I32_MAX // 2, "q.shape[0]", "below 2**30 tokens", tokens)


def _check_lengths(tokens, k_cache, block_table, query_start_loc, seq_lens, bs):
    """Data checks on host copies of the metadata (plain device-to-host copies, one sync, no GPU
    kernel): offsets, lengths within block_table's width, used block ids within the cache."""
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    _need(qsl[0] == 0, "query_start_loc[0]", "0", qsl[0])
    q_lens = [b - a for a, b in zip(qsl, qsl[1:])]
    _need(min(q_lens, default=0) >= 0, "query_start_loc", "non-decreasing", qsl)
    _need(qsl[-1] <= tokens, "query_start_loc[-1]", f"<= q.shape[0] = {tokens}", qsl[-1])
    used = []
    for b, (ql, sl) in enumerate(zip(q_lens, lens)):
        _need(sl >= ql, f"seq_lens[{b}]", f">= its {ql} new tokens", sl)
        used.append(-(-(sl - ql) // bs))
        _need(used[-1] <= block_table.shape[1], f"seq_lens[{b}]", f"a context of at most {block_table.shape[1]} "
              f"blocks of {bs} tokens (block_table's width)", sl)
    width = max(used, default=0)
    if width == 0:
        return
    ids = block_table[: len(used), :width].cpu()
    in_use = torch.arange(width)[None, :] < torch.tensor(used)[:, None]
    bad = in_use & ((ids < 0) | (ids >= k_cache.shape[0]))
    if bool(bad.any()):
        b = int(bad.nonzero()[0, 0])
        row = ids[b, : used[b]]
        _need(False, f"block_table[{b}, :{used[b]}]", f"block ids in [0, {k_cache.shape[0]})",
              (int(row.min()), int(row.max())))


def launch_plan(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, out, kv_layout, k_scale,
                v_scale, sm_scale, window, sinks, out_scale, skip_decode):
    """(axes, grid, args) of the kernel launch for validated arguments (the bench reuses it)."""
    tokens, q_heads, head_dim = q.shape
    batch = block_table.shape[0]
    fp8 = k_cache.dtype in _FP8
    bs = k_cache.shape[1] if kv_layout == "nhd" else k_cache.shape[3]
    axes = _spec.axes_for(_DTYPES[q.dtype], _FP8.get(k_cache.dtype, "same"), head_dim, kv_layout)
    block_m = _spec.tile(head_dim)[0]
    # Flattened q-block schedule: request b owns q blocks [qsl[b] // BLOCK_M + b, ...); this bound
    # covers them all without reading query_start_loc on the host (see kernel.py).
    grid = (tokens // block_m + batch, q_heads, 1)
    dummy = _dummy_f32(q.device)
    if kv_layout == "nhd":
        kc = (k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), 0)
        vc = (v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), 0)
    else:  # K token stride is X and V token stride 1: implied, passed as 0
        kc = (k_cache.stride(0), 0, k_cache.stride(1), k_cache.stride(2))
        vc = (v_cache.stride(0), 0, v_cache.stride(1), v_cache.stride(2))
    args = (
        q, k, v, k_cache.view(torch.uint8), v_cache.view(torch.uint8), out.view(torch.uint8),
        block_table, query_start_loc, seq_lens,
        k_scale if fp8 else dummy, v_scale if fp8 else dummy,
        out_scale if out_scale is not None else dummy, sinks if sinks is not None else dummy,
        float(sm_scale), batch, q_heads // k.shape[1], bs, block_table.stride(0), int(window or 0),
        int(sinks is not None), int(out_scale is not None), int(skip_decode),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        *kc, *vc,
    )
    return axes, grid, args


def _prefix_prefill_op(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, out, kv_layout, k_scale,
                       v_scale, sm_scale, window, sinks, out_scale, skip_decode, validate) -> None:
    from aotc.loader.dispatch import run_kernel

    if validate:
        bs = k_cache.shape[1] if kv_layout == "nhd" else k_cache.shape[3]
        _check_lengths(q.shape[0], k_cache, block_table, query_start_loc, seq_lens, bs)
    if block_table.shape[0] == 0 or q.shape[1] == 0:
        return
    axes, grid, args = launch_plan(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, out,
                                   kv_layout, k_scale, v_scale, sm_scale, window, sinks, out_scale, skip_decode)
    run_kernel(_spec.PREFIX_PREFILL, axes, grid, args)


def _prefix_prefill_fake(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, out, kv_layout, k_scale,
                         v_scale, sm_scale, window, sinks, out_scale, skip_decode, validate) -> None:
    return None  # the public function validated every argument before calling the op


library.define("prefix_prefill(Tensor q, Tensor k, Tensor v, Tensor k_cache, Tensor v_cache, Tensor block_table, "
               "Tensor query_start_loc, Tensor seq_lens, Tensor(a!) out, str kv_layout, Tensor? k_scale, "
               "Tensor? v_scale, float sm_scale, SymInt window, Tensor? sinks, Tensor? out_scale, bool skip_decode, "
               "bool validate) -> ()", _prefix_prefill_op, _prefix_prefill_fake)


def prefix_prefill(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, *, kv_layout="nhd",
                   k_scale=None, v_scale=None, sm_scale=None, window=None, sinks=None, out_scale=None,
                   skip_decode=False, out=None, validate=None) -> torch.Tensor:
    """Attention of new tokens over a paged context plus, causally, themselves.

    Shapes (T new tokens over all requests, B requests, D = head_dim):
      q `[T, q_heads, D]`; k, v `[T, kv_heads, D]`: the new tokens (not read from the cache);
        fp16 or bf16, last dim contiguous; q_heads a multiple of kv_heads.
      k_cache, v_cache: kv_layout "nhd": `[num_blocks, block_size, kv_heads, D]` each;
        "vllm": K `[num_blocks, kv_heads, D // x, block_size, x]`, V `[num_blocks, kv_heads, D, block_size]`,
        x = 16 // element size. dtype q's, or float8_e4m3fn / float8_e5m2 with `k_scale`, `v_scale`
        (one-element float32 tensors; value = fp8 * scale). Any block size.
      block_table `[B, max_blocks]` int32; query_start_loc `[B + 1]` int32 (request b's new tokens are
        rows query_start_loc[b]:query_start_loc[b+1]; rows past query_start_loc[B] are not touched);
        seq_lens `[B]` int32: context + new tokens. New token i of request b sits at position
        seq_lens[b] - q_len + i and sees the context and new tokens <= i.
      D in (64, 80, 96, 128, 256).
    Options: sm_scale (default 1/sqrt(D)); window: keys at distance < window only (None or 0: all);
      sinks `[q_heads]` float32 logits joined to each row's softmax normalizer; out_scale: a
      one-element float32 tensor, and the output is float8_e4m3fn = clamp(out / out_scale, +-448);
      skip_decode: requests with exactly one new token are skipped (their rows are not written);
      out: the result tensor (like q, or float8_e4m3fn with out_scale); allocated when None.
      validate: copy the lengths and the used block-table entries to the host and check them
      (query_start_loc non-decreasing from 0, contexts within block_table's width, block ids
      within the cache): one device sync. Default: on, except under CUDA-graph capture and
      torch.compile; pass False in a hot eager loop whose metadata is known good.
    Returns out `[T, q_heads, D]`.
    Raises TypeError for a wrong type or dtype and ValueError for a wrong shape, stride, device,
    option or (when validated) length, naming the argument, before anything is launched.
    `out` may not share memory with any input (ValueError naming it). NaN and inf in the inputs are
    not checked: NaN in, NaN out (a non-finite q row, or k/v row it attends to, gives that row
    non-finite values; other rows are unaffected).
    """
    _validate(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, kv_layout, k_scale,
                       v_scale, sm_scale, window, sinks, out_scale, out)
    if out is None:
        out = torch.empty(q.shape, dtype=torch.float8_e4m3fn if out_scale is not None else q.dtype,
                          device=q.device)
    if validate is None:
        validate = not (torch.compiler.is_compiling()
                        or (query_start_loc.is_cuda and torch.cuda.is_current_stream_capturing()))
    sm = 1.0 / math.sqrt(q.shape[2]) if sm_scale is None else float(sm_scale)
    # Through the dispatcher (fake tensors get the Meta implementation); a prefill kernel runs for
    # milliseconds, so its few microseconds do not matter here as they do for decode.
    torch.ops.aotc.prefix_prefill(q, k, v, k_cache, v_cache, block_table, query_start_loc, seq_lens, out, kv_layout,
                                  k_scale, v_scale, sm, int(window or 0), sinks, out_scale, bool(skip_decode),
                                  bool(validate))
    return out
