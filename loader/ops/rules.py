"""The argument rules every op shares, in one message form: `<op>: <name> must be <expected>, got
<what it got>` (TypeError for a type or dtype, ValueError for anything else), so an op file
reads as rules, plan, launch. Beside them: byte views of tensors, the int32 bound the kernels'
index arithmetic lives in, tensor metadata as plans compare it (`Meta`, and `matcher`: one C
call for a plan's hot path), and the bounded plan cache.

(guards.py holds the checks that are not about one argument's shape: grad, outputs that
overlap, numbers, index narrowing.)
"""
from __future__ import annotations

import torch

I32_MIN, I32_MAX = -2 ** 31, 2 ** 31 - 1


def fail(op: str, name: str, expected: str, got, exc=ValueError):
    """Raise `exc` in the shared form; `expected` reads after "must be"."""
    raise exc(f"{op}: {name} must be {expected}, got {got}")


def need(op: str, cond: bool, name: str, expected: str, got) -> None:
    """`fail` unless `cond`."""
    if not cond:
        fail(op, name, expected, got)


def tensor(op: str, name: str, t, dtypes=None, dim=None, device=None, int32_strides=False, last_contiguous=False):
    """t, checked: a torch.Tensor of one of `dtypes`, with `dim` dims (an int or a tuple of them),
    on `device` (the first argument's), with strides in int32 when `int32_strides`, its last dim
    contiguous when `last_contiguous`. Returns t."""
    if not isinstance(t, torch.Tensor):
        fail(op, name, "a torch.Tensor", type(t).__name__, TypeError)
    if dtypes is not None and t.dtype not in dtypes:
        fail(op, name, f"of dtype {' or '.join(str(d) for d in dtypes)}", t.dtype, TypeError)
    if dim is not None and t.dim() not in ((dim,) if isinstance(dim, int) else dim):
        dims = dim if isinstance(dim, int) else " or ".join(map(str, dim))
        fail(op, name, f"{dims}-D", f"shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        fail(op, name, f"on {device} (the first argument's device)", t.device)
    if int32_strides:
        strides_fit(op, {name: t})
    if last_contiguous:
        unit_last(op, name, t)
    return t


def unit_last(op: str, name: str, t) -> None:
    """The last dim contiguous (stride 1), as every kernel reads rows."""
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        fail(op, name, "contiguous in its last dim (stride 1)", f"strides {t.stride()}")


def strides_fit(op: str, tensors: dict) -> None:
    """Every stride in [0, 2**31): the kernels take strides as int32 (None entries skipped)."""
    for name, t in tensors.items():
        if t is not None and any(s < 0 or s > I32_MAX for s in t.stride()):
            fail(op, f"{name}'s strides", "in [0, 2**31)", t.stride())


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A uint8 tensor starting at t's first element, to the end of its storage: what a JIT or
    interpreter launch binds to a pointer the kernel reads as bytes (t may be 0-D or strided,
    which .view cannot take)."""
    storage = t.untyped_storage()
    offset = t.storage_offset() * t.element_size()
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage, offset, (storage.nbytes() - offset,), (1,))


def meta(t):
    """What a plan depends on of a tensor (None for None): size(), stride(), dtype, get_device()
    are the cheapest reads of shape and device (-1 on the CPU)."""
    return None if t is None else (t.size(), t.stride(), t.dtype, t.get_device())


class Meta:
    """A tensor's dtype, size, stride and device, as a plan's full check compares them (the
    device itself: get_device() is -1 for a CPU and a meta tensor alike)."""

    __slots__ = ("dtype", "size", "stride", "device")

    def __init__(self, t):
        self.dtype, self.size, self.stride, self.device = t.dtype, t.size(), t.stride(), t.device

    def matches(self, t) -> bool:
        return (t.dtype is self.dtype and t.size() == self.size and t.stride() == self.stride
                and t.device == self.device)

    def describe(self) -> str:
        return f"dtype {self.dtype}, shape {tuple(self.size)}, strides {self.stride}"


def _python_matcher(tensors):
    """`matcher`'s rule in Python (a torch without the C guard): ~4 reads a tensor."""
    want = [(type(t), t.dtype, t.size(), t.stride(), t.device, t.requires_grad) for t in tensors]

    def match(*got) -> bool:
        if len(got) != len(want) or len({id(t) for t in got}) != len(got):
            return False
        return all(type(t) is w[0] and t.dtype is w[1] and t.size() == w[2] and t.stride() == w[3]
                   and t.device == w[4] and t.requires_grad == w[5] for t, w in zip(got, want))
    return match


def matcher(*tensors):
    """A `match(*tensors) -> bool`, True when each given tensor has the type, dtype, device (type
    and index), sizes, strides and requires_grad of the one in the same place here, the tensors
    are distinct objects, and torch's dispatch state (inference mode, autocast, modes) is as it
    was here. Anything else (None, a tensor under another mode) gives False: the caller then
    runs its full checks. It reads each tensor's live metadata, so an in-place resize_/set_/
    as_strided_ is seen. torch's own C guard (what torch.compile's guards call: one call for
    every tensor, ~0.1 us a tensor against ~0.5 us for reading four attributes in Python;
    BENCHMARKS.md "Launch overhead"), else the same rule in Python."""
    try:
        from torch._C._dynamo.guards import TensorGuards

        return TensorGuards(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None).check
    except (ImportError, AttributeError, TypeError):
        return _python_matcher(tensors)


def call_matcher(*examples):
    """A `match(*args) -> bool` for calls like `examples`: where an example is a tensor, the
    argument matches it (`matcher`: one guard over all of them); where it is None, the argument
    is None; any other example, the argument is that object or an equal one of its exact type (a
    bool is not an int). Straight-line code, as `library`'s plan keys: an eager call runs it."""
    names = [f"a{i}" for i in range(len(examples))]
    namespace: dict = {}
    tests, tensors = [], []
    for a, (i, x) in zip(names, enumerate(examples)):
        if x is None:
            tests.append(f"{a} is None")
        elif isinstance(x, torch.Tensor):
            tensors.append(a)
        else:
            namespace[f"c{i}"], namespace[f"t{i}"] = x, type(x)
            tests.append(f"({a} is c{i} or (type({a}) is t{i} and {a} == c{i}))")
    if tensors:
        namespace["g"] = matcher(*[x for x in examples if isinstance(x, torch.Tensor)])
        tests.append(f"g({', '.join(tensors)})")
    src = f"def match({', '.join(names)}):\n    return {' and '.join(tests) or 'True'}\n"
    exec(compile(src, "<aotc match>", "exec"), namespace)  # noqa: S102 - built from the examples' kinds
    return namespace["match"]


def never(*tensors) -> bool:
    """A matcher that matches nothing (a plan without a fast path)."""
    return False


def describe(t) -> str:
    if not isinstance(t, torch.Tensor):
        return f"a {type(t).__name__}"
    return f"dtype {t.dtype}, shape {tuple(t.shape)}, strides {t.stride()}, device {t.device}"


class PlanCache(dict):
    """An op's plans by the inputs' metadata: a call whose tensors have the shapes, strides,
    dtypes and devices of a call already checked skips the checks and the argument derivation.
    Bounded (emptied when full), so a stream of ever-new shapes cannot grow it without limit;
    emptied by `dispatch.reset` (after `set_artifacts`), since its plans hold prepared launches."""

    def __init__(self, limit: int = 4096):
        super().__init__()
        self.limit = limit
        from ..dispatch import register_plan_cache

        register_plan_cache(self)

    def put(self, key, plan):
        """Keep `plan` under `key` (a None key, from arguments that are not tensors, keeps nothing)."""
        if key is not None:
            if len(self) >= self.limit:
                self.clear()
            self[key] = plan
        return plan


class Recent:
    """An op's eager steady states (each with a `match` from `call_matcher`), newest first, at most
    `limit`: a call tries them in order before its full checks. Emptied with the plan caches."""

    def __init__(self, limit: int = 4):
        self.limit = limit
        self.entries: tuple = ()
        from ..dispatch import register_plan_cache

        register_plan_cache(self)

    def add(self, entry) -> None:
        self.entries = (entry, *self.entries[:self.limit - 1])

    def clear(self) -> None:
        self.entries = ()
