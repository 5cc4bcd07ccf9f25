"""What the plan objects of prefix_prefill and gated delta share (`Plan`): an op's call planned
once for fixed shapes, dtypes and options, then run with pointers only, as DecodePlan and
MLADecodePlan run decode's and mla_decode's split+merge.

A subclass checks its arguments in its constructor with its op's own checks (the value checks
once), owns what its launches write besides the outputs (a workspace), packs the step's fixed
pointers into private copies of its launches' parameter buffers and calls `setup` with the
example tensors of `run`'s arguments (`ARGS`, the written ones named in `OUTPUTS`). `run` is
then the steady.Steady sequence: one C call (rules.call_matcher) compares every tensor's dtype,
sizes, strides, device and requires_grad with the examples' (None where the example is None),
the current device is the plan's, the subclass's `pointers` reads each pointer once (None: an
address its binary was not compiled for), the overlap test runs on those addresses (guards.Apart,
the step's fixed tensors included), and its `go` packs and launches. Anything else takes
`run_checked`: each difference named (TypeError for a type or dtype, ValueError otherwise), grad
refused, overlap named, then the prepared launch or the subclass's `general` path (the CPU
interpreter, the JIT fallback, another current device, an address the prepared binary does not
take: the eager op, which names a bad address).
"""
from __future__ import annotations

import torch

from . import guards, rules, steady

MATCH_REBUILDS = 4  # a plan re-derives its matcher this often (a new dispatch mode), then keeps the full check


class Plan(steady.Steady):
    """The shared half of a plan object; see the module docstring. Subclasses set NAME (their
    class name, in messages), ARGS, OUTPUTS, `pointers`, `go` and `general`."""

    NAME = "Plan"
    OUTPUTS: tuple = ()

    def setup(self, examples: tuple, fixed: dict, order: tuple, prepared: bool, device) -> None:
        """examples: run's arguments in ARGS order; fixed: the step's tensors the plan keeps (their
        addresses are compared with the outputs'); order: what each slot of `pointers`' tuple holds;
        prepared: whether `go` can launch (built binaries on a CUDA device)."""
        named = dict(zip(self.ARGS, examples))
        outputs = {n: named[n] for n in self.OUTPUTS}
        inputs = {n: t for n, t in named.items() if n not in outputs}
        apart = guards.Apart(self.NAME + ".run", outputs, inputs, fixed=fixed)
        self._apart, self._apart_index = apart, [self.ARGS.index(n) for n in (*outputs, *inputs)]
        self._meta = [None if t is None else rules.Meta(t) for t in examples]
        self.device, self.prepared, self._rebuilds = device, prepared, 0
        super().__init__(self._matcher(examples), apart, order, device.index)

    def _matcher(self, args):
        """run's one-call check over tensors like `args`, or `rules.never` where runs take the full
        check: no prepared launch, or a tensor that requires grad (refused when grad mode is on)."""
        if not self.prepared or not steady.grad_free(args):
            return rules.never
        return rules.call_matcher(*args)

    def check(self, args: tuple) -> None:
        """ValueError/TypeError naming the first argument unlike the plan's, NotImplementedError for
        grad, ValueError naming an output that overlaps another argument; nothing launched."""
        op = self.NAME + ".run"
        for name, m, t in zip(self.ARGS, self._meta, args):
            if m is None:
                if t is not None:
                    rules.fail(op, name, "None (this plan was made without it)", rules.describe(t))
            elif not isinstance(t, torch.Tensor) or t.dtype is not m.dtype:
                rules.fail(op, name, f"{m.describe()} on {m.device} (this plan's)", rules.describe(t), TypeError)
            elif not m.matches(t):
                rules.fail(op, name, f"{m.describe()} on {m.device} (this plan's)", rules.describe(t))
        if torch.is_grad_enabled():
            guards.refuse_grad(op, **dict(zip(self.ARGS, args)))
        self._apart(*[args[i] for i in self._apart_index])

    def run_checked(self, args: tuple) -> None:
        """run() with every check spelled out, then the prepared launch or the general path."""
        self.check(args)
        if self.prepared and _current_device() == self.index:
            p = self.pointers(*args)
            if p is not None and self.go(p, _current_stream(self.index)) is not False:
                if self._rebuilds < MATCH_REBUILDS:  # checked and launched, yet not matched: another dispatch mode
                    self._rebuilds += 1
                    self.match = self._matcher(args)
                return
        self.general(*args)


# torch's own bindings, called directly (a CPU-only torch has none: its plans are never prepared)
_current_device = getattr(torch._C, "_cuda_getDevice", None)
_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
