"""The `aotc` torch.library namespace, and `Op`: each public op declared once.

Every public op is also a dispatcher op (`torch.ops.aotc.<name>`), so `torch.compile(fullgraph=True)`
traces through it. An op is declared by its schema, the one place its arguments are listed with
types; from it `Op` registers the op (the real implementation under CompositeExplicitAutograd,
the shape-only one under Meta, what fake tensors run while tracing), checks at import that the
functions it was given take exactly the schema's arguments in order, and generates the plan key
(the metadata of every tensor argument and the value and type of every other one).

    DECODE = library.Op("decode(Tensor q, ..., Tensor(a!) out) -> ()", check=_check, run=_run)

`check(*args)` raises for bad arguments and returns the checked call; `run(checked)` launches it;
the fake runs `check` alone. An op whose checks run in its public function instead passes
`impl=` and `fake=` (taking the schema's arguments).

`torch.library.custom_op` would infer the same schemas, but its registration inspects source
files and costs several milliseconds an op, paid by the first call of the op in a fresh process
(which imports it); this costs a few hundred microseconds.
"""
from __future__ import annotations

import inspect
import re

import torch

_LIB = torch.library.Library("aotc", "FRAGMENT")


def define(schema: str, impl, fake) -> None:
    """Define `aotc::<name>(...)` from `schema`: `impl` runs it, `fake` checks it on meta tensors."""
    name = schema.split("(", 1)[0]
    _LIB.define(schema)
    _LIB.impl(name, impl, "CompositeExplicitAutograd")
    _LIB.impl(name, fake, "Meta")


def parse(schema: str) -> tuple[str, list[tuple[str, str]]]:
    """(op name, [(argument name, type)]) of a schema such as `f(Tensor x, Tensor(a!)? y=None) -> ()`."""
    name, rest = schema.split("(", 1)
    body = rest[:rest.rindex(") ->")]
    args = []
    for part in re.split(r",\s*(?![^()]*\))", body):
        typ, arg = part.split("=", 1)[0].rsplit(None, 1)
        args.append((arg, re.sub(r"\([^)]*\)", "", typ)))
    return name, args


def _parameters(fn) -> list[str]:
    return [p.name for p in inspect.signature(fn).parameters.values()]


def _key_function(name: str, args: list[tuple[str, str]]):
    """A generated `key(*args)`: each tensor's size, stride, dtype and device index (None for an
    absent optional one), each other argument's value and type (True == 1, and hashes alike).
    Straight-line code: the eager path computes it every call. Raises AttributeError/TypeError
    for arguments that are not what the schema says (the checks then say what is wrong)."""
    items, names = [], [a for a, _ in args]
    for arg, typ in args:
        # get_device() is -1 for a CPU and a meta tensor alike: is_cpu tells them apart
        if typ == "Tensor":
            items.append(f"{arg}.size(), {arg}.stride(), {arg}.dtype, {arg}.get_device(), {arg}.is_cpu")
        elif typ == "Tensor?":
            items.append(f"None if {arg} is None else ({arg}.size(), {arg}.stride(), {arg}.dtype, "
                         f"{arg}.get_device(), {arg}.is_cpu)")
        else:
            items.append(f"{arg}, type({arg})")
    src = f"def key({', '.join(names)}):\n    return ({', '.join(items)},)\n"
    namespace: dict = {}
    exec(compile(src, f"<aotc key {name}>", "exec"), namespace)  # noqa: S102 - built from the schema
    return namespace["key"]


class Op:
    """One op declared once (see the module docstring): `op.key(*args)` is the plan key, `op(*args)`
    calls the dispatcher op (what the public function does under torch.compile)."""

    def __init__(self, schema: str, check=None, run=None, impl=None, fake=None):
        self.name, self.args = parse(schema)
        names = [a for a, _ in self.args]
        if impl is None:
            impl = lambda *a: run(check(*a))  # noqa: E731
        if fake is None:
            fake = lambda *a: check(*a) and None  # noqa: E731
        for fn in (check, impl, fake):
            if fn is not None and not getattr(fn, "__name__", "") == "<lambda>" and _parameters(fn) != names:
                raise TypeError(f"{self.name}: {fn.__qualname__} takes {_parameters(fn)}, the schema declares {names}")
        self.check, self.run = check, run
        self.key = _key_function(self.name, self.args)
        define(schema, impl, fake)
        self._dispatch = None

    def __call__(self, *args):
        if self._dispatch is None:
            self._dispatch = getattr(torch.ops.aotc, self.name)
        return self._dispatch(*args)
