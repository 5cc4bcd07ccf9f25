"""An eager call's steady state, the one sequence every op's shares: a call already checked once
with this input metadata is matched in one C call (`match`: rules.call_matcher over every
argument, run by the op's loop over its `rules.Recent`), then `run` takes it to the launch: on
the plan's device, the op's pointers read once (`pointers`), the overlap test on those addresses
(`meets`), the op's packing and driver calls on the current stream (`go`). An op's subclass
states only what differs: its pointer list (in its launch's order, which `meets` takes too), its
overlap pairs (the `guards.Apart` it passes) and its `go`.
"""
from __future__ import annotations

import torch

MAX_PER_PLAN = 4  # steady states a plan makes (a new dispatch mode re-derives one), then calls keep the full path


def grad_free(tensors) -> bool:
    """No tensor requires grad: a steady state never checks grad mode, so calls that could need the
    refusal keep the full path."""
    return not any(t is not None and t.requires_grad for t in tensors)


class Steady:
    """match -> pointers -> overlap -> pack -> go. A subclass names its call's arguments (`ARGS`,
    as its op's loop passes them to `run`), sets `pointers(*ARGS) -> tuple | None` (None: an
    address the chosen binary was not compiled for) and `go(pointers, stream)` (False: it
    launched nothing), and passes its Apart with the pointer tuple's names (`order`: what each
    slot holds; a name the Apart does not know is not compared; None: the Apart's own order).
    `run` returns False, launching nothing, where the full path must decide and name any error:
    another current device, a refused address, overlapping tensors, a `go` that cannot launch."""

    __slots__ = ("match", "meets", "index")
    ARGS: tuple = ()

    def __init__(self, match, apart, order, index):
        self.match, self.meets, self.index = match, apart.on_pointers(order), index

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.ARGS:
            cls.steady_run = _run_taking(cls.ARGS)
            if "run" not in cls.__dict__:  # a plan object keeps its own run (plan.Plan), which calls steady_run
                cls.run = cls.steady_run

    def run(self, *call) -> bool:
        """The sequence; each subclass runs this code generated with its own ARGS (`_run_taking`)."""
        index = self.index
        if _current_device() != index:
            return False
        p = self.pointers(*call)
        if p is None or self.meets(*p):
            return False
        return self.go(p, _current_stream(index)) is not False


def _run_taking(args: tuple):
    """Steady.run with `args` spelled out: a *call signature costs ~0.1-0.2 us a call (BENCHMARKS.md
    "Launch overhead")."""
    a = ", ".join(args)
    src = (f"def run(self, {a}) -> bool:\n"
           "    index = self.index\n"
           "    if _current_device() != index:\n"
           "        return False\n"
           f"    p = self.pointers({a})\n"
           "    if p is None or self.meets(*p):\n"
           "        return False\n"
           "    return self.go(p, _current_stream(index)) is not False\n")
    namespace: dict = {}
    exec(compile(src, "<aotc steady run>", "exec"), globals(), namespace)  # noqa: S102 - built from argument names
    return namespace["run"]


# torch's own bindings, called directly (a CPU-only torch has none, and makes no steady state)
_current_device = getattr(torch._C, "_cuda_getDevice", None)
_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
