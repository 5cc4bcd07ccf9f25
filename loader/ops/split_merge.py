"""The launch shared by `decode` and `mla_decode` (and their plans): a split kernel writes each
sequence split's partial output and log-sum-exp into a workspace, a merge kernel combines them.

Both kernel families take the same arguments (split: q, k, v, k_scale, v_scale, table, rows,
lengths, partial out, partial lse, then decode's ALiBi slopes (a split spec with an `Alibi`
argument), then ints; merge: partial out, partial lse, sinks, out, lse, then ints), so one
`SplitMerge` holds what a call's metadata fixes (variants, grids, ints,
workspace sizes, the two prepared `launch.Launch`es; `rot`, what the `Alibi` slot holds for a call
without slopes: decode's int4_rht signs) and launches it three ways:
- `launch(...)`: an eager call, on the current stream with the stream's workspace, the two launches
  held together under the stream's lock; the prepared launches where the binaries are built, else
  `run_kernel` (the JIT fallback, the CPU interpreter, another current device);
- `bind(...)`: a plan's private launches (`Bound`), its own workspace and the step's table,
  lengths, rows and sinks packed once; `Bound.run` packs a layer's five or six pointers;
- `Eager`: an unvalidated eager call's steady state (a steady.Steady: one C call matches the
  arguments, each pointer read once, both prepared launches on the stream's workspace).
"""
from __future__ import annotations

import contextlib
import ctypes
import struct
import threading

import torch

from .. import workspace
from ..dispatch import prepare, programs_per_sm, run_kernel
from . import rules, steady

_ones: dict = {}


def one(device) -> torch.Tensor:
    """A float32 1.0 on `device`: the fp8 scale a call without one reads."""
    t = _ones.get(device)
    if t is None:
        t = _ones[device] = torch.ones(1, dtype=torch.float32, device=device)
    return t


def fp8_scales(k_scale, v_scale, device):
    """fp8 scales as the kernels read them: fp32, 1.0 where absent."""
    return ((k_scale if k_scale is not None else one(device)).float(),
            (v_scale if v_scale is not None else one(device)).float())


class SplitMerge:
    """What a split+merge launch needs that follows from the inputs' metadata alone.

    fp8: the scales are fp8's (1.0 where absent). byte_view: the cache is read as int8 bytes (fp8,
    int4). halfword: the address mask of the cache, checked every call (a plan is keyed by
    metadata, not by address): 1 for int16 words (int8, int4), 3 for decode's kv_align 4 binaries
    (4-byte words), 7 for its kv_align 8 ones, 0 for none. residues: (mask, K's residue, V's
    residue) the binary was compiled for (`address_residues`): a call's cache addresses must have
    `(kp & mask) == k_res and (vp & mask) == v_res`, which the fast paths test as one expression,
    `((kp - k_res) | (vp - v_res)) & mask` zero (mask + 1 a power of two). alibi: the split kernel
    takes ALiBi slopes after the partial lse (decode's). fast_split / fast_merge: the prepared
    launches, or None (run_kernel's path). apart: guards.Apart of the call, set by the op.
    """

    __slots__ = ("split_spec", "split_axes", "split_grid", "split_ints", "merge_spec", "merge_axes", "merge_grid",
                 "merge_ints", "n_o", "n_lse", "device", "fmt", "fp8", "byte_view", "halfword", "residues",
                 "fast_split", "fast_merge", "apart", "alibi", "rot", "eager_made")

    def __init__(self, split, merge, n_o: int, n_lse: int, device, fmt: str, fp8: bool, byte_view: bool,
                 halfword: int, rot=None):
        """split, merge: (spec, axes, grid, ints) of each kernel. rot: a tensor the split kernel's
        `Alibi` slot holds when a call passes no slopes (decode's int4_rht signs), else None."""
        self.split_spec, self.split_axes, self.split_grid, self.split_ints = split
        self.alibi = "Alibi" in self.split_spec.arg_index
        self.rot = rot
        self.merge_spec, self.merge_axes, self.merge_grid, self.merge_ints = merge
        self.n_o, self.n_lse, self.device, self.fmt = n_o, n_lse, device, fmt
        self.fp8, self.byte_view, self.halfword = fp8, byte_view, halfword
        self.residues = address_residues(halfword)
        self.fast_split = self.fast_merge = None
        self.apart = None
        self.eager_made = 0  # Eager steady states made for this plan (bounded: see Eager.make)
        if device.type == "cuda" and self.launches_anything():
            split_l, merge_l = self._prepare()
            if split_l is not None and merge_l is not None:
                merge_l.lock = split_l.lock  # one lock for both buffers: launch_pointers packs them together
                self.fast_split, self.fast_merge = split_l, merge_l

    def launches_anything(self) -> bool:
        return all(self.split_grid) and all(self.merge_grid)

    def _prepare(self):
        index = self.device.index
        return (prepare(self.split_spec, self.split_axes, self.split_grid, self.split_ints, index),
                prepare(self.merge_spec, self.merge_axes, self.merge_grid, self.merge_ints, index))

    def check_halfword(self, k_ptr: int, v_ptr: int) -> None:
        """ValueError naming the cache whose address the plan's binary was not compiled for."""
        mask, k_res, v_res = address_residues(self.halfword)
        if mask == 7:  # decode's kv_align 8: vLLM's per-token-head record (decode._vllm_record)
            if (k_ptr & mask) != k_res or (v_ptr & mask) != v_res:
                raise ValueError(f"k_cache/v_cache: this plan reads vLLM's per-token-head record (kv_align 8): k_cache "
                                 f"must start at a multiple of 8 bytes and v_cache 4 bytes past one, got addresses "
                                 f"{k_ptr:#x} / {v_ptr:#x}")
            return
        if (k_ptr | v_ptr) & mask:
            name = "k_cache" if k_ptr & mask else "v_cache"
            if mask == 1:
                raise ValueError(f"{name}: an {self.fmt} cache is read two bytes at a time; its data must start at "
                                 f"an even address (it is a view at an odd byte offset)")
            raise ValueError(f"{name}: this per-token {self.fmt} cache is read 4 bytes at a time (kv_align 4); its "
                             f"data must start at a multiple of 4 bytes")

    def split_args(self, q, k, v, k_scale, v_scale, table, req_idx, seq_lens, part_o, part_lse, alibi=None) -> list:
        """The split kernel's arguments as run_kernel takes them (tensors, then the ints)."""
        return split_args(self.fp8, self.byte_view, q, k, v, k_scale, v_scale, table, req_idx, seq_lens, part_o,
                          part_lse, self.split_ints, self._alibi(alibi, part_lse) if self.alibi else None)

    def _alibi(self, alibi, part_lse):
        """What the `Alibi` slot holds: the call's slopes, else rot, else a pointer never read."""
        return alibi if alibi is not None else self.rot if self.rot is not None else part_lse

    def launch(self, q, k, v, k_scale, v_scale, table, req_idx, seq_lens, sinks, out, lse=None, alibi=None) -> None:
        """One eager call (k, v: the paged [pages, page_size, heads, d] views)."""
        if self.fast_split is not None:
            index = self.device.index
            if torch._C._cuda_getDevice() == index:
                self._launch_prepared(q, k, v, k_scale, v_scale, table, req_idx, seq_lens, sinks, out, lse,
                                      torch._C._cuda_getCurrentRawStream(index), alibi)
                return
        if self.halfword:
            self.check_halfword(k.data_ptr(), v.data_ptr())
        if not self.launches_anything():
            return
        part_o, part_lse = workspace.pair(q.device, self.n_o, self.n_lse)
        if q.is_cuda:
            index = q.device.index if q.device.index is not None else torch.cuda.current_device()
            together = workspace.stream_lock(index, torch._C._cuda_getCurrentRawStream(index))
        else:
            together = contextlib.nullcontext()  # CPU: a fresh workspace a call
        with together:
            run_kernel(self.split_spec, self.split_axes, self.split_grid,
                       self.split_args(q, k, v, k_scale, v_scale, table, req_idx, seq_lens, part_o, part_lse, alibi))
            run_kernel(self.merge_spec, self.merge_axes, self.merge_grid,
                       [part_o, part_lse, sinks if sinks is not None else part_lse, out,
                        lse if lse is not None else part_lse, *self.merge_ints])

    def _launch_prepared(self, q, k, v, k_scale, v_scale, table, req_idx, seq_lens, sinks, out, lse, stream,
                         alibi=None):
        """The steady-state launch: pointers only; grids and every other argument are packed."""
        keep, part_o, part_lse = workspace.pair_pointers(self.device, stream, self.n_o, self.n_lse)
        if self.fp8:
            keep = fp8_scales(k_scale, v_scale, self.device)
            ks, vs = keep[0].data_ptr(), keep[1].data_ptr()
        elif k_scale is None:
            ks = vs = part_lse  # never read: fp16/bf16 caches have no scales
        else:
            ks, vs = k_scale.data_ptr(), v_scale.data_ptr()
        lens = seq_lens.data_ptr()
        kp, vp = k.data_ptr(), v.data_ptr()
        if self.halfword:
            self.check_halfword(kp, vp)
        with workspace.stream_lock(self.device.index, stream):  # no other call's split between ours and our merge
            pointers = (q.data_ptr(), kp, vp, ks, vs, table.data_ptr(), lens if req_idx is None else req_idx.data_ptr(),
                        lens, part_o, part_lse)
            if self.alibi:
                a = self._alibi(alibi, part_lse)
                pointers += (a if isinstance(a, int) else a.data_ptr(),)
            self.fast_split(pointers, stream)
            self.fast_merge((part_o, part_lse, part_lse if sinks is None else sinks.data_ptr(), out.data_ptr(),
                             part_lse if lse is None else lse.data_ptr()), stream)
        del keep

    def bind(self, table, seq_lens, req_idx, sinks, return_lse: bool):
        """A plan's private launches with the step's tensors packed in (`Bound`), or None (the general path)."""
        if self.fast_split is None:
            return None
        split_l, merge_l = self._prepare()
        if split_l is None or merge_l is None:
            return None
        return Bound(self, split_l, merge_l, table, seq_lens, req_idx, sinks, return_lse)


def address_residues(halfword: int) -> tuple:
    """(mask, K's residue, V's residue) of a SplitMerge's cache addresses: decode's kv_align 8
    binaries read vLLM's per-token-head record (decode._vllm_record: K 8-byte aligned, V 4 bytes
    past an 8-byte boundary); every other mask wants both residues 0."""
    mask = int(halfword)
    return mask, 0, (4 if mask == 7 else 0)


class Eager(steady.Steady):
    """An eager call's steady state for one input metadata (decode's and mla_decode's, a
    steady.Steady): pointers in the Apart's order (out, lse, then the inputs as decode._inputs
    names them), the cache's address residues those of the plan's binary (SplitMerge.residues),
    then `go`: both prepared launches packed and issued on the stream's workspace (its address
    remembered while workspace.generation stands) under the stream's lock; nothing launched on
    a stream whose workspace is not yet big enough (the full path grows it)."""

    ARGS = ("q", "k", "v", "table", "seq_lens", "req_idx", "k_scale", "v_scale", "sinks", "out", "lse", "alibi")
    __slots__ = ("plan", "one", "mask", "k_res", "v_res", "alibi", "rot", "split_pack", "split_buffer",
                 "merge_pack", "merge_buffer", "packing", "split_go", "merge_go", "split_misaligned",
                 "merge_misaligned", "ws")

    def __init__(self, match, plan: SplitMerge, apart):
        super().__init__(match, apart, None, plan.device.index)
        self.plan = plan
        self.one = one(plan.device).data_ptr()  # fp8 without scales reads 1.0; fp16/bf16 read no scale
        self.mask, self.k_res, self.v_res = plan.residues
        self.alibi = plan.alibi
        self.rot = None if plan.rot is None else plan.rot.data_ptr()  # the Alibi slot without slopes (SplitMerge.rot)
        split, merge = plan.fast_split, plan.fast_merge
        self.split_pack, self.split_buffer, self.merge_pack, self.merge_buffer = \
            split.pack, split.buffer, merge.pack, merge.buffer
        self.packing = split.lock  # the plan's buffers (the merge's shares it), also packed by calls on other streams
        self.split_go, self.merge_go = (split.go(False), split.go(True)), (merge.go(False), merge.go(True))
        self.split_misaligned, self.merge_misaligned = split.misaligned, merge.misaligned
        self.ws = (None, -1, None, 0, 0)  # (stream, workspace.generation, stream lock, partial out, partial lse)

    @staticmethod
    def make(plan: SplitMerge, args: tuple, tensors: tuple, scales: tuple, outputs: dict, inputs: dict):
        """An Eager for a call that the full path just checked and launched, or None where calls like
        it must keep the full path: no prepared launches, a tensor that requires grad, fp8 scales
        not in fp32 (converted per call), or the plan's quota spent. args: the call's arguments
        in the order `match` will take them; tensors: every tensor argument."""
        if (plan.fast_split is None or plan.eager_made >= steady.MAX_PER_PLAN or not steady.grad_free(tensors)
                or (plan.fp8 and any(s is not None and s.dtype != torch.float32 for s in scales))):
            return None
        plan.eager_made += 1
        from .guards import Apart

        return Eager(rules.call_matcher(*args), plan, Apart("eager", outputs, inputs))

    def pointers(self, q, k, v, table, seq_lens, req_idx, k_scale, v_scale, sinks, out, lse, alibi):
        kp, vp = k.data_ptr(), v.data_ptr()
        if ((kp - self.k_res) | (vp - self.v_res)) & self.mask:
            return None
        lp = seq_lens.data_ptr()
        if k_scale is None:
            ksp = vsp = self.one
        else:
            ksp, vsp = k_scale.data_ptr(), v_scale.data_ptr()
        return (out.data_ptr(), None if lse is None else lse.data_ptr(), q.data_ptr(), kp, vp, table.data_ptr(), lp,
                lp if req_idx is None else req_idx.data_ptr(), ksp, vsp, None if sinks is None else sinks.data_ptr(),
                self.rot if alibi is None else alibi.data_ptr())

    def go(self, p, stream) -> bool:
        ws = self.ws
        if ws[0] != stream or ws[1] != workspace.generation:
            ws = self._stream_workspace(stream)
            if ws is None:
                return False
        _, _, lock, po, pl = ws
        op, lsep, qp, kp, vp, tp, lp, rp, ksp, vsp, sp, ap = p
        if self.alibi:
            sptrs = (qp, kp, vp, ksp, vsp, tp, rp, lp, po, pl, pl if ap is None else ap)
        else:
            sptrs = (qp, kp, vp, ksp, vsp, tp, rp, lp, po, pl)
        mptrs = (po, pl, pl if sp is None else sp, op, pl if lsep is None else lsep)
        packing = self.packing
        lock.acquire()
        packing.acquire()
        try:
            self.split_pack(self.split_buffer, 0, *sptrs)
            self.merge_pack(self.merge_buffer, 0, *mptrs)
            self.split_go[not self.split_misaligned(sptrs)](stream)
            self.merge_go[not self.merge_misaligned(mptrs)](stream)
        finally:
            packing.release()
            lock.release()
        return True

    def _stream_workspace(self, stream):
        plan = self.plan
        generation = workspace.generation  # read before the buffer: a later swap shows as a new generation
        buf = workspace._buffers.get((self.index, stream))
        if buf is None or buf.numel() < plan.n_o + plan.n_lse:
            return None
        po = buf.data_ptr()
        self.ws = ws = (stream, generation, workspace.stream_lock(self.index, stream), po, po + 4 * plan.n_o)
        return ws


PACK5 = struct.Struct("<5Q").pack_into  # a plan's per-layer split pointers: q, k, v and the two scales


class Bound:
    """A plan's two launches: its own workspace (split partials), the step's table, lengths, rows
    and sinks packed once; `run(qp, kp, vp, ksp, vsp, op, lsep, stream)` packs a layer's q, k, v,
    scales (split) and out, lse (merge; lsep None for a plan without lse) and launches both: the
    one copy of a plan's launch, which DecodePlan.run and MLADecodePlan.run call."""

    __slots__ = ("split", "merge", "index", "workspace", "dummy", "one", "lock", "run")

    def __init__(self, sm: SplitMerge, split, merge, table, seq_lens, req_idx, sinks, return_lse):
        dev = sm.device
        self.workspace = torch.zeros(sm.n_o + sm.n_lse, dtype=torch.float32, device=dev)  # see workspace.get
        part_o = self.workspace.data_ptr()
        part_lse = part_o + 4 * sm.n_o
        lens = seq_lens.data_ptr()
        fixed = {5: table.data_ptr(), 6: lens if req_idx is None else req_idx.data_ptr(), 7: lens, 8: part_o,
                 9: part_lse}
        if sm.alibi:  # a plan runs no score modifiers: int4_rht's signs, or a pointer never read
            fixed[10] = part_lse if sm.rot is None else sm.rot.data_ptr()
        split.fix(fixed)
        split.per_call(0, 5)
        merge.fix({0: part_o, 1: part_lse, 2: part_lse if sinks is None else sinks.data_ptr(), 4: part_lse})
        merge.per_call(3, 2 if return_lse else 1)
        self.split, self.merge, self.index = split, merge, dev.index
        self.dummy = part_lse  # a scale pointer never read (fp16/bf16 caches)
        self.one = one(dev).data_ptr() if sm.fp8 else part_lse  # fp8 without scales reads 1.0
        self.lock = threading.Lock()
        self.run = _bound_run(self.lock, split, merge)


def _bound_run(lock, split, merge):
    """A Bound's `run`: a closure, so that every name it reads is a local cell (a plan's hot path).
    The cheapest writes (BENCHMARKS.md "Launch overhead"): one pack_into for the split's five
    slots, an item store for the merge's one or two; acquire/release, not `with` (half the cost).
    The driver calls, by alignment (GENERIC, ALIGNED), resolved once: a run only indexes them."""
    acquire, release, pack5, split_buffer = lock.acquire, lock.release, PACK5, split.buffer
    merge_slots = (ctypes.c_uint64 * 5).from_buffer(merge.buffer)
    split_go, merge_go = (split.go(False), split.go(True)), (merge.go(False), merge.go(True))

    def run(qp, kp, vp, ksp, vsp, op, lsep, stream) -> None:
        acquire()
        try:
            pack5(split_buffer, 0, qp, kp, vp, ksp, vsp)
            merge_slots[3] = op
            if lsep is not None:
                merge_slots[4] = lsep
            split_go[not (qp | kp | vp) & 15](stream)
            merge_go[not op & 15](stream)
        finally:
            release()
    return run


def split_args(fp8, byte_view, q, k, v, k_scale, v_scale, table, req_idx, seq_lens, part_o, part_lse, ints,
               alibi=None) -> list:
    """alibi: the slopes tensor (or a stand-in) for a split kernel that takes one, else None."""
    if fp8:
        ks, vs = fp8_scales(k_scale, v_scale, q.device)
    elif k_scale is None:
        ks = vs = part_lse  # never read: fp16/bf16 caches have no scales
    else:
        ks, vs = k_scale, v_scale
    if byte_view and k.dtype != torch.int8:
        k, v = k.view(torch.int8), v.view(torch.int8)  # raw bytes, widened in the kernel
    extra = [] if alibi is None else [alibi]
    return [q, k, v, ks, vs, table, req_idx if req_idx is not None else seq_lens, seq_lens, part_o, part_lse, *extra,
            *ints]


def split_programs_per_sm(spec, axes, fp8, byte_view, q, k, v, k_scale, v_scale, table, req_idx, seq_lens,
                          ints) -> int | None:
    """How many split programs fit an SM (decode's split-count rule reads it); None on the CPU."""
    if not q.is_cuda or not q.shape[0]:
        return None
    ws = workspace.get(q.device, 16)  # stands in for the workspace: only its alignment matters
    return programs_per_sm(spec, axes, split_args(fp8, byte_view, q, k, v, k_scale, v_scale, table, req_idx,
                                                  seq_lens, ws, ws, ints, ws if "Alibi" in spec.arg_index else None),
                           q.device.index)
