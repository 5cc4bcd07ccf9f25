"""The checks every op shares that are not about one argument's shape or dtype: inference only (no
autograd), outputs that own their memory, numbers that are not bools, and index tensors narrowed to
int32 only when their values fit. Each op calls these from the path that already checks its
arguments; messages name the op and the argument.

Outputs (and tensors updated in place, such as a state pool or a KV cache) must not have two
elements in one place (an `expand()`ed or stride-0 view: torch refuses writes into those too)
and must not share a byte with any input or another output: a kernel that writes one program's
rows while another program still reads them gives a silently wrong answer. Internal overlap is a
property of sizes and strides, checked once per new metadata where an op caches plans; overlap
between tensors depends on their addresses, so a plan carries an `Apart` that compares pointers
on every call (a data_ptr() and two comparisons a tensor).
"""
from __future__ import annotations

import math

import torch

_I32_MIN, _I32_MAX = -2 ** 31, 2 ** 31 - 1


# -- autograd ----------------------------------------------------------------------------------
def refuse_grad(op: str, **tensors) -> None:
    """NotImplementedError naming the first tensor that requires grad while grad mode is on: the
    ops have no backward, so a gradient would be silently dropped (and an in-place write would
    put a cache into the autograd graph)."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.requires_grad:
            raise NotImplementedError(
                f"aotc is inference-only: {op}: {name} requires grad and aotc's kernels have no backward; "
                f"call it under torch.no_grad() or torch.inference_mode(), or pass {name}.detach()")


# -- outputs -----------------------------------------------------------------------------------
def self_overlapping(t: torch.Tensor) -> bool:
    """Whether two elements of t may share memory (sizes and strides only): a stride 0 on a dim
    of size > 1 (expand), or strides that let dims interleave. torch's own verdict first; where it
    cannot tell (a strided view), dims sorted by stride must each step past the ones below."""
    verdict = torch._debug_has_internal_overlap(t)  # 0: no, 1: yes, 2: too hard to tell
    if verdict != 2:
        return verdict == 1
    span = 1  # elements reached by the dims below, plus one
    for stride, size in sorted((abs(st), n) for n, st in zip(t.shape, t.stride()) if n > 1):
        if stride < span:
            return True
        span += (size - 1) * stride
    return False


def check_outputs(op: str, outputs: dict, inputs: dict) -> None:
    """ValueError naming an output (entries that are not tensors skipped) that overlaps itself,
    another output or an input. Ops that cache plans keep the `Apart` half for later calls."""
    for name, t in outputs.items():
        if isinstance(t, torch.Tensor) and t.numel() > 1 and _self_overlapping_safe(t):
            raise ValueError(f"{op}: {name} has elements that share memory (strides {t.stride()} for shape "
                             f"{tuple(t.shape)}: an expand()ed or stride-0 view); the op writes every element, "
                             f"so pass a tensor whose elements each have their own memory")
    tensors = (*outputs.values(), *inputs.values())
    if any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in tensors):
        return  # no memory to compare
    try:
        apart = Apart(op, outputs, inputs)
        starts = [tensors[i].data_ptr() for i in apart.live]
    except (RuntimeError, NotImplementedError):  # fake tensors under tracing: no data pointer, symbolic sizes
        return
    apart.compare(starts)


def _self_overlapping_safe(t) -> bool:
    try:
        return self_overlapping(t)
    except (RuntimeError, NotImplementedError, TypeError):  # symbolic sizes under tracing
        return False


def byte_extent(t) -> int:
    """Bytes from t's first element to just past its last one (0 for an empty tensor or a non-tensor)."""
    if not isinstance(t, torch.Tensor) or not t.numel():
        return 0
    return (sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()


class Apart:
    """The per-call half of check_outputs for a cached plan: byte extents taken once from the
    checked call's tensors (equal metadata gives equal extents), then a call compares pointers.
    `fixed` tensors (kept alive by the caller, such as a DecodePlan's table) are compared by the
    addresses they had when the plan was made."""

    __slots__ = ("op", "names", "live", "extents", "n_out", "fixed", "_fast", "n", "argnames")

    def __init__(self, op: str, outputs: dict, inputs: dict, fixed: dict | None = None):
        self.op = op
        tensors = (*outputs.values(), *inputs.values())
        self.n = len(tensors)
        # Which arguments hold bytes is metadata too (None and empty tensors hold none): fixed per plan.
        self.live = [i for i, t in enumerate(tensors) if byte_extent(t)]
        self.argnames = names = list(outputs) + list(inputs)
        self.names = [names[i] for i in self.live]
        self.extents = [byte_extent(tensors[i]) for i in self.live]
        self.n_out = sum(i < len(outputs) for i in self.live)
        self.fixed = [(t.data_ptr(), t.data_ptr() + byte_extent(t)) for t in (fixed or {}).values() if byte_extent(t)]
        self.names += [n for n, t in (fixed or {}).items() if byte_extent(t)]
        self._fast = None

    def __call__(self, *tensors) -> None:
        """tensors: the call's outputs then inputs, in the order given at construction."""
        if self._fast is None:
            self._fast = self._generate(len(tensors))
        if self._fast(*tensors):  # some pair meets: the general comparison names it
            self.compare([tensors[i].data_ptr() for i in self.live])

    def on_pointers(self, order=None):
        """A straight-line `meets(p0, ..., pn) -> bool` over the call's addresses (ints, outputs
        then inputs in the constructor's order, or in `order`: the tensors' names, one a slot, a
        name not given here marking a slot not compared; slots that hold no bytes are not read):
        True where an output's bytes meet another's. For launch paths that read each pointer
        once (a launch's own pointer tuple, with `order`); on True, `compare` names the pair."""
        if order is None:
            return self._generate(self.n, pointers=True)
        slot = {name: i for i, name in reversed(list(enumerate(order)))}
        missing = [self.argnames[i] for i in self.live if self.argnames[i] not in slot]
        if missing:
            raise ValueError(f"{self.op}: the pointer order names no slot for {missing}")
        return self._generate(len(order), pointers=True, slots=[slot[self.argnames[i]] for i in self.live])

    def _generate(self, n: int, pointers: bool = False, slots=None):
        """A straight-line `apart(t0, ..., tn) -> bool` (True where an output's bytes meet another's):
        the per-call half of a plan runs on every call, and a loop over pairs costs microseconds.
        slots: the argument each live tensor is read from (default: the constructor's order)."""
        live, ext = (self.live if slots is None else slots), self.extents
        lines = [f"    p{k} = t{i}" + ("" if pointers else ".data_ptr()") for k, i in enumerate(live)]
        names = [f"p{k}" for k in range(len(live))]
        ends = [f"p{k} + {e}" for k, e in enumerate(ext)]
        tests = []
        for a in range(self.n_out):
            others = [(names[b], ends[b]) for b in range(len(live)) if b != a]
            others += [(str(b0), str(b1)) for b0, b1 in self.fixed]
            tests += [f"({b0} < {ends[a]} and {names[a]} < {b1})" for b0, b1 in others]
        src = (f"def apart({', '.join(f't{i}' for i in range(n))}):\n" + "\n".join(lines) +
               f"\n    return {' or '.join(tests) or 'False'}\n")
        namespace: dict = {}
        exec(compile(src, "<aotc apart>", "exec"), namespace)  # noqa: S102 - built from sizes and addresses
        return namespace["apart"]

    def compare(self, starts: list) -> None:
        """ValueError when an output's bytes meet another's; starts: the live tensors' addresses."""
        ends = [p + e for p, e in zip(starts, self.extents)]
        for b0, b1 in self.fixed:
            starts.append(b0)
            ends.append(b1)
        for i in range(self.n_out):
            a0, a1 = starts[i], ends[i]
            j = 0
            for b0 in starts:
                if b0 < a1 and a0 < ends[j] and j != i:
                    self._refuse(i, self.names[j])
                j += 1

    def _refuse(self, i: int, other: str):
        name = self.names[i]
        raise ValueError(f"{self.op}: {name} overlaps {other} in memory; pass a separate tensor "
                         f"(the op writes {name} while {other} is in use)")


# -- numbers -----------------------------------------------------------------------------------
def real(op: str, name: str, value) -> float:
    """A finite int or float (not a bool: True is not a scale of 1.0) as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{op}: {name} must be a float, got {type(value).__name__} {value!r:.40}")
    if not math.isfinite(value):
        raise ValueError(f"{op}: {name} must be a finite float, got {value!r}")
    return float(value)


def integer(op: str, name: str, value, lo: int | None = None, hi: int | None = None) -> int:
    """An int (not a bool) in [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__} {value!r:.40}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ValueError(f"{op}: {name} must be in [{lo}, {hi}], got {value}")
    return value


# -- index narrowing ---------------------------------------------------------------------------
def check_int32_range(op: str, name: str, t: torch.Tensor) -> None:
    """ValueError naming the first value of an int64 index tensor outside int32 (values copied to
    the host: one device sync). A wrapped value would land on another slot, page or length."""
    if t.dtype == torch.int32 or not t.numel():
        return
    flat = t.reshape(-1)
    bad = ((flat < _I32_MIN) | (flat > _I32_MAX)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise ValueError(f"{op}: {name}[{i}] = {int(flat[i])} does not fit int32 (the kernels read int32 indices)")


def to_int32(op: str, name: str, t: torch.Tensor, validate: bool, pad: int | None = None) -> torch.Tensor:
    """t as int32: int64 values range-checked first when `validate`; unvalidated (graph capture),
    values outside int32 become `pad` on the device (a padded slot) when given."""
    if t.dtype == torch.int32:
        return t
    if validate:
        check_int32_range(op, name, t)
    elif pad is not None:
        t = t.masked_fill((t < _I32_MIN) | (t > _I32_MAX), pad)
    return t.to(torch.int32)
