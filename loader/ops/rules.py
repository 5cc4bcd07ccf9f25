"""The argument rules every op shares, in one message form: `<op>: <name> must be <expected>, got
<what it got>` (TypeError for a type or dtype, ValueError for anything else), so an op file
reads as rules, plan, launch. Beside them: byte views of tensors, the int32 bound the kernels'
index arithmetic lives in, tensor metadata as plans compare it, and the bounded plan cache.

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
    """A tensor's dtype, size, stride and device index, as a plan's run() compares them."""

    __slots__ = ("dtype", "size", "stride", "device")

    def __init__(self, t):
        self.dtype, self.size, self.stride, self.device = t.dtype, t.size(), t.stride(), t.get_device()

    def matches(self, t) -> bool:
        return (t.dtype is self.dtype and t.size() == self.size and t.stride() == self.stride
                and t.get_device() == self.device)

    def describe(self) -> str:
        return f"dtype {self.dtype}, shape {tuple(self.size)}, strides {self.stride}"


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
