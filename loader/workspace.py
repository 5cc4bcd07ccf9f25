"""Scratch buffers for ops that need device memory between two launches (decode's split partials).

One fp32 buffer per (device, stream), grown and never shrunk, so steady-state calls allocate
nothing. A buffer that is replaced by a larger one stays referenced here: a CUDA graph captured
earlier may still point at it. While the current stream is capturing, a buffer too small is not
grown here: the call gets a fresh tensor from the graph's private pool, which lives as long as
the graph does. Two graphs that use one stream's buffer must not replay concurrently on
different streams.

Threads that share a stream share its buffer: an op whose launches pass data through it holds
`stream_lock` across them, else thread B's first launch could land between thread A's two and
overwrite A's partials (found by tests/gpu/soak.py's design: 4 threads on 2 streams).
"""
from __future__ import annotations

import threading

_buffers: dict[tuple[int, int], object] = {}
_retired: list = []  # replaced buffers a captured graph may still point at
_lock = threading.Lock()
# Bumped whenever a buffer is allocated or replaced: a launch path that remembers a stream's
# buffer address (split_merge.Eager) compares one int instead of looking the buffer up.
generation = 0


_pairs: dict = {}


def pair(device, n_first: int, n_second: int):
    """Two adjacent fp32 views (`n_first`, `n_second` elements) of the stream's buffer.

    The views are cached per (device, stream, sizes) while the buffer stays: the steady state
    costs two dict lookups and no tensor creation.
    """
    import torch

    if device.type == "cuda":
        bkey = _buffer_key(device)
        key = (*bkey, n_first, n_second)
        got = _pairs.get(key)
        if got is not None and got[2] is _buffers.get(bkey):
            return got[0], got[1]
    ws = get(device, n_first + n_second)
    first, second = ws[:n_first], ws[n_first:]
    if device.type == "cuda" and not torch.cuda.is_current_stream_capturing():
        if len(_pairs) > 1024:
            _pairs.clear()
        _pairs[key] = (first, second, _buffers.get(bkey))
    return first, second


def pair_pointers(device, stream: int, n_first: int, n_second: int):
    """`pair`'s two views as device pointers, for `stream` (the current stream of `device`, a
    CUDA device with an index): (owner, first, second). Hold `owner` until the launches that use
    the pointers are issued (it may be a fresh tensor while a graph is being captured)."""
    buf = _buffers.get((device.index, stream))
    if buf is None or buf.numel() < n_first + n_second:
        buf = get(device, n_first + n_second)
    p = buf.data_ptr()
    return buf, p, p + 4 * n_first


_stream_locks: dict = {}


def stream_lock(index: int, stream: int) -> threading.Lock:
    """The lock that keeps one call's launches on (device `index`, `stream`) together."""
    lock = _stream_locks.get((index, stream))
    if lock is None:
        with _lock:
            lock = _stream_locks.setdefault((index, stream), threading.Lock())
    return lock


def _buffer_key(device):
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    return index, torch._C._cuda_getCurrentRawStream(index)


def get(device, numel: int):
    """An fp32 tensor of `numel` elements on `device` (16-byte aligned). Zeros when allocated, then
    what the last call left: never uninitialized memory, so a masked-off read of a slot no
    launch wrote (decode's merge reads empty splits' partials and selects them away) reads
    initialized bytes (compute-sanitizer initcheck)."""
    import torch

    if device.type != "cuda":
        return torch.empty(numel, dtype=torch.float32, device=device)
    key = _buffer_key(device)
    buf = _buffers.get(key)
    if buf is not None and buf.numel() >= numel:
        return buf[:numel]
    if torch.cuda.is_current_stream_capturing():
        return torch.zeros(numel, dtype=torch.float32, device=device)
    global generation
    with _lock:
        buf = _buffers.get(key)
        if buf is None or buf.numel() < numel:
            generation += 1
            if buf is not None:
                _retired.append(buf)
            # Grow by at least 2x so a slowly rising demand reallocates O(log) times.
            size = max(numel, 2 * buf.numel() if buf is not None else 0)
            buf = _buffers[key] = torch.zeros(size, dtype=torch.float32, device=device)
    return buf[:numel]
