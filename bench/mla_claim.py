"""Experiment (issue 39): MLA 16-head latent decode whose splits claim their tiles at run time.

The static split kernel (kernels/decode/mla_kernel.py) gives each of a request's `splits` programs
an equal, contiguous chunk, so every program ends with the slowest SM band (BENCHMARKS.md, "MLA
decode", Per program). Here the `splits` programs of request b keep their own (m, l, acc) partial
(MLA's merge unchanged) but take tiles from an int32 counter Counters[b] by a relaxed
`atomic_add(CHUNK)`; a program holds the chunk it works on and the next one, claimed a chunk ahead,
so programs on fast SMs take more tiles. The tile loop is one pipelined `for` of `bound` trips
(eighths/8 of the fair share cdiv(tiles, splits): a for loop cannot end early, a while loop is not
pipelined); trips past the request's tiles read nothing (masked copies) but still run the dots (an `if`
around them loses the cp.async ring: SASS of sm90, 0 cp.async), and a plain while loop after it takes what the bound left. Page ids one tile ahead, 3 stages, 4 warps,
32-token tiles, as the static kernel's PAGE_AHEAD path. No PDL; Triton's JIT; merge through
aotc's MLA merge (JIT). The prototype zeroes the counters before each call (a memset kernel);
production would need a graph-safe reset, e.g. the merge zeroing them after reading the partials
(counters allocated zeroed once in the workspace).

    python bench/mla_claim.py --check           # against the float32 reference (several lengths)
    python bench/mla_claim.py --out rows.jsonl  # static vs claiming, kernel sums + events + loop ends
"""
import argparse
import json
import statistics

import torch
import triton
import triton.language as tl

from aotc.kernels.decode import mla_spec as MS
from aotc.kernels.decode import spec as DS
from aotc.kernels.decode.mla_kernel import mla_split_kernel
from aotc.loader.dispatch import run_kernel

LOG2E = tl.constexpr(1.4426950408889634)
PAGE, D_QK, D_V, H = 64, 576, 512, 16
SM_SCALE = 1 / 24


@triton.jit
def _globaltimer(x):
    # %globaltimer read once x has arrived (as bench/mla_timeline.py's _after)
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $1, 2147483647; @p mov.u64 $0, %globaltimer; @!p mov.u64 $0, 0; }",
        "=l,r", [x], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _smid(x):
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [x], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _advance(ctr, cur, nxt, left, n_tiles, CHUNK, base):
    # the tile after `cur`: the next of its chunk, else the chunk claimed ahead (and claim another)
    adv = left == 1
    want = adv & (nxt < n_tiles)
    claim = tl.atomic_add(ctr, CHUNK, mask=want, sem="relaxed")
    ncur = tl.where(adv, nxt, cur + 1)
    nxt = tl.where(want, base + claim, nxt)
    left = tl.where(adv, CHUNK, left - 1)
    return ncur, nxt, left


@triton.jit(do_not_specialize=["max_pages", "stride_table", "chunk_tiles", "eighths"])
def claim_split(Q, K, Table, SeqLens, Counters, PartO, PartLse, Times, sm_scale, page_shift, max_pages,
                stride_table, chunk_tiles, eighths, stride_qb, stride_qh, stride_kp, stride_kt,
                D_V: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_H: tl.constexpr, HYBRID: tl.constexpr, TIMED: tl.constexpr):
    b = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    seq_len = tl.maximum(tl.minimum(tl.load(SeqLens + b), max_pages << page_shift), 0)
    n_tiles = tl.cdiv(seq_len, BLOCK_N)
    ctr = Counters + b
    CHUNK = chunk_tiles
    if HYBRID:
        # a static contiguous share of eighths/8 of the tiles first, the rest claimed after it
        bound = (n_tiles * eighths // 8) // num_splits
        base = num_splits * bound
        cur = split * bound
        nxt = n_tiles
        left = 0 * cur
    else:
        base = 0
        cur = tl.atomic_add(ctr, CHUNK, sem="relaxed")
        nxt = tl.atomic_add(ctr, CHUNK, mask=cur + CHUNK < n_tiles, sem="relaxed")
        nxt = tl.where(cur + CHUNK < n_tiles, nxt, n_tiles)
        left = CHUNK + 0 * cur
        fair = tl.cdiv(n_tiles, num_splits)
        bound = tl.minimum(fair * eighths // 8, n_tiles)

    heads = tl.arange(0, BLOCK_H)
    table_row = Table + b.to(tl.int64) * stride_table
    DT: tl.constexpr = Q.dtype.element_ty
    qk_scale = sm_scale * LOG2E
    q_rows = Q + b.to(tl.int64) * stride_qb + heads[:, None].to(tl.int64) * stride_qh
    offs_a = tl.arange(0, BLOCK_A)
    qa = tl.load(q_rows + offs_a[None, :])
    offs_b = BLOCK_A + tl.arange(0, BLOCK_B)
    qb = tl.load(q_rows + offs_b[None, :])
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_A], dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    taken = cur * 0
    offs_first = cur * BLOCK_N + offs_n
    page_next = tl.load(table_row + (offs_first >> page_shift), mask=offs_first < seq_len, other=0)
    for _ in range(0, bound):
        t0 = cur * BLOCK_N
        offs_t = t0 + offs_n
        t_mask = offs_t < seq_len
        page = page_next.to(tl.int64)
        live = t0 < seq_len
        taken += live.to(tl.int32)
        if HYBRID:
            cur = cur + 1
        else:
            cur, nxt, left = _advance(ctr, cur, nxt, left, n_tiles, CHUNK, base)
        offs_ahead = cur * BLOCK_N + offs_n
        page_next = tl.load(table_row + (offs_ahead >> page_shift), mask=offs_ahead < seq_len, other=0)
        slot = (offs_t & ((1 << page_shift) - 1)).to(tl.int64)
        k_row = page * stride_kp + slot * stride_kt
        ka = tl.load(K + k_row[:, None] + offs_a[None, :], mask=t_mask[:, None], other=0)
        kb = tl.load(K + k_row[:, None] + offs_b[None, :], mask=t_mask[:, None], other=0)
        qk = tl.dot(qa, tl.trans(ka))
        qk += tl.dot(qb, tl.trans(kb))
        qk = tl.where(t_mask[None, :], qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # a dead trip (all -inf) keeps the state: alpha 1, p 0 (m_new is finite once a live tile ran)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(qk - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
        acc = acc * alpha[:, None] + tl.dot(p.to(DT), ka)
    if HYBRID:
        cur = base + tl.atomic_add(ctr, CHUNK, sem="relaxed")
        nxt = tl.atomic_add(ctr, CHUNK, mask=cur + CHUNK < n_tiles, sem="relaxed")
        nxt = tl.where(cur + CHUNK < n_tiles, base + nxt, n_tiles)
        left = CHUNK + 0 * cur
    # what the bound left (HYBRID: the claimed rest): one tile a trip, not pipelined
    while cur < n_tiles:
        offs_t = cur * BLOCK_N + offs_n
        t_mask = offs_t < seq_len
        taken += 1
        page = tl.load(table_row + (offs_t >> page_shift), mask=t_mask, other=0).to(tl.int64)
        slot = (offs_t & ((1 << page_shift) - 1)).to(tl.int64)
        k_row = page * stride_kp + slot * stride_kt
        ka = tl.load(K + k_row[:, None] + offs_a[None, :], mask=t_mask[:, None], other=0)
        kb = tl.load(K + k_row[:, None] + offs_b[None, :], mask=t_mask[:, None], other=0)
        qk = tl.dot(qa, tl.trans(ka))
        qk += tl.dot(qb, tl.trans(kb))
        qk = tl.where(t_mask[None, :], qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
        acc = acc * alpha[:, None] + tl.dot(p.to(DT), ka)
        cur, nxt, left = _advance(ctr, cur, nxt, left, n_tiles, CHUNK, base)
    got = taken > 0
    if TIMED:
        t_end = _globaltimer(tl.sum(l_i, 0).to(tl.int32, bitcast=True))
    slot_ids = (b * BLOCK_H + heads).to(tl.int64) * num_splits + split
    offs_v = tl.arange(0, BLOCK_A)
    inv_l = 1.0 / tl.where(l_i > 0, l_i, 1.0)
    tl.store(PartO + slot_ids[:, None] * D_V + offs_v[None, :], acc * inv_l[:, None], mask=got)
    lse = tl.where(got, m_i + tl.log2(tl.where((l_i > 0) | (l_i != l_i), l_i, 1.0)), float("-inf"))
    tl.store(PartLse + slot_ids, lse)
    if TIMED:
        pid = tl.program_id(2) * tl.num_programs(1) + tl.program_id(1)
        row = Times + pid.to(tl.int64) * 4
        tl.store(row + 0, _smid(pid).to(tl.int64))
        tl.store(row + 1, t_end)
        tl.store(row + 2, taken.to(tl.int64))


def problem(batch, ctx, seed=0, lens=None):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(dev).manual_seed(seed)
    pages_per = max(1, -(-ctx // PAGE))
    kv = torch.randn(batch * pages_per, PAGE, 1, D_QK, generator=g, device=dev).to(torch.bfloat16)
    table = torch.randperm(batch * pages_per, generator=g, device=dev).view(batch, pages_per).to(torch.int32)
    q = torch.randn(batch, H, D_QK, generator=g, device=dev).to(torch.bfloat16)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev) if lens is None else \
        torch.tensor(lens, dtype=torch.int32, device=dev)
    return q, kv, table, lens


class Call:
    """One configuration's launches: kind 'static' (main's mla_split_kernel, PAGE_AHEAD, no PDL) or
    'claim' (chunk tiles a claim); the merge after either. NaN-poisoned partials and output."""

    def __init__(self, q, kv, table, lens, splits, kind, chunk=1, eighths=8, timed=False):
        batch, dev = q.shape[0], q.device
        self.args = (q, kv, table, lens)
        self.splits, self.kind, self.chunk, self.eighths, self.timed = splits, kind, chunk, eighths, timed
        self.part_o = torch.full((batch * H * splits * D_V,), float("nan"), device=dev)
        self.part_lse = torch.full((batch * H * splits,), float("nan"), device=dev)
        self.out = torch.full((batch, H, D_V), float("nan"), dtype=torch.bfloat16, device=dev)
        self.counters = torch.zeros(batch, dtype=torch.int32, device=dev)
        self.times = torch.zeros(batch * splits, 4, dtype=torch.int64, device=dev)
        self.ma = MS.merge_axes("bf16", D_V, splits)
        self.mgrid = DS.merge_grid(batch, H, self.ma)
        self.merge = MS.merge_spec(D_V)

    def __call__(self):
        q, kv, table, lens = self.args
        grid = (1, q.shape[0], self.splits)
        if self.kind == "static":
            mla_split_kernel[grid](
                q, kv, kv, lens, lens, table, lens, lens, self.part_o, self.part_lse,
                SM_SCALE, 0, 0, 6, table.shape[1], table.stride(0), H, H,
                q.stride(0), q.stride(1), kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(0), kv.stride(1),
                kv.stride(2), D_QK=D_QK, D_V=D_V, BLOCK_A=512, BLOCK_B=64, BLOCK_DV=512, BLOCK_N=32, BLOCK_H=16,
                LATENT=1, KV_KIND=0, PAGE_AHEAD=1, PDL=0, PTX=0, num_warps=4, num_stages=3)
        else:
            self.counters.zero_()
            claim_split[grid](
                q, kv, table, lens, self.counters, self.part_o, self.part_lse, self.times, SM_SCALE, 6,
                table.shape[1], table.stride(0), self.chunk, self.eighths, q.stride(0), q.stride(1),
                kv.stride(0), kv.stride(1), D_V=D_V, BLOCK_A=512, BLOCK_B=64, BLOCK_N=32, BLOCK_H=16,
                HYBRID=int(self.kind == "hybrid"), TIMED=int(self.timed), num_warps=4, num_stages=3)
        run_kernel(self.merge, self.ma, self.mgrid,
                   [self.part_o, self.part_lse, self.part_lse, self.out, self.part_lse, 0, 0, H, self.splits,
                    self.out.stride(0), self.out.stride(1), 0])


def reference(q, kv, table, lens):
    """float32 attention over each request's latent cache (value = the first D_V channels)."""
    outs = []
    for b in range(q.shape[0]):
        n = int(lens[b])
        pages = table[b, :max(1, -(-n // PAGE))].long()
        k = kv[pages, :, 0, :].reshape(-1, D_QK)[:n].float()
        s = (q[b].float() @ k.T) * SM_SCALE
        outs.append(torch.softmax(s, -1) @ k[:, :D_V] if n else torch.zeros(H, D_V, device=q.device))
    return torch.stack(outs)


CHECKS = (  # (lengths of one batch, splits): 1, tile-1, tile, tile+1, page edges, long; mixed per request
    ([1, 31, 32, 33, 63, 64, 65, 4096], 8), ([1, 31, 33, 2000, 5000, 97, 7, 4095], 4),
    ([4096] * 4, 16), ([32768], 128), ([33, 1], 16),
)


def check(configs):
    if not torch.cuda.is_available():
        from aotc.loader.interpreter import patch_interpreter
        patch_interpreter()  # aotc's fixes to Triton's interpreter (scalar loads), as run_jit applies them
    worst = 0.0
    for lens, splits in CHECKS:
        if not torch.cuda.is_available() and max(lens) > 4096:
            continue  # the interpreter: short ones only
        q, kv, table, lt = problem(len(lens), max(lens), seed=len(lens) + splits, lens=lens)
        ref = reference(q, kv, table, lt)
        for kind, chunk, eighths in configs:
            if kind == "static" and not q.is_cuda:
                continue  # main's kernel under the interpreter is tests/cpu's business
            c = Call(q, kv, table, lt, splits, kind, chunk, eighths)
            c()
            err = (c.out.float() - ref).abs().max().item()
            rel = ((c.out.float() - ref).norm() / ref.norm()).item()
            worst = max(worst, err)
            ok = err <= 4e-3 * max(1.0, ref.abs().max().item()) and rel <= 5e-3  # bf16 output rounding
            print(f"check lens {lens} splits {splits} {kind} chunk {chunk} bound {eighths}/8: max abs {err:.2e} "
                  f"rel {rel:.2e} {'ok' if ok else 'FAIL'}", flush=True)
            if not ok:
                raise SystemExit("claiming kernel disagrees with the float32 reference")
            if kind == "claim":
                taken = int(c.counters.sum())
                assert taken >= sum(-(-n // 32) for n in lens), "counters short of the tiles"
    print(f"check: all within tolerance (max abs {worst:.2e})", flush=True)


def timed(c, reps=20):
    flush = torch.ones(64 << 20, dtype=torch.int32, device="cuda")
    sink = torch.empty((), dtype=torch.int64, device="cuda")
    c()
    c()
    torch.cuda.synchronize()
    evs = []
    for _ in range(reps):
        torch.sum(flush, 0, dtype=torch.int64, out=sink)  # L2 emptied
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        c()
        e.record()
        torch.cuda.synchronize()
        evs.append(s.elapsed_time(e) * 1e3)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            torch.sum(flush, 0, dtype=torch.int64, out=sink)
            c()
        torch.cuda.synchronize()
    per = {}
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = "split" if "split" in ev.name else "merge" if "merge" in ev.name else \
            "reset" if ("fill" in ev.name.lower() or "zero" in ev.name.lower() or "memset" in ev.name.lower()) else None
        if name:
            per.setdefault(name, []).append(ev.device_time)
    r = {k + "_us": statistics.median(v) for k, v in per.items()}
    r["event_us"] = statistics.median(evs)
    return r


def loop_ends(c, reps=5):
    """per-call loop-end spread of the instrumented claiming kernel: p0/p50/p100 us from the first
    program's loop end, and the tiles a program took (min / max)."""
    flush = torch.ones(64 << 20, dtype=torch.int32, device="cuda")
    sink = torch.empty((), dtype=torch.int64, device="cuda")
    c()
    stats = {}
    for _ in range(reps):
        torch.sum(flush, 0, dtype=torch.int64, out=sink)
        c()
        torch.cuda.synchronize()
        t = c.times.cpu()
        ends = sorted(((t[:, 1] - t[:, 1].min()).double() / 1e3).tolist())
        for p in (0, 10, 50, 90, 100):
            stats.setdefault(f"loopend_p{p}", []).append(ends[min(len(ends) - 1, int(p / 100 * len(ends)))])
        stats.setdefault("tiles_min", []).append(int(t[:, 2].min()))
        stats.setdefault("tiles_max", []).append(int(t[:, 2].max()))
    return {k: statistics.median(v) for k, v in stats.items()}


SHAPES = ((32, 4096), (32, 32768), (128, 4096), (1, 32768))
# (kind, tiles a claim, the pipelined loop's trips in eighths of the fair share)
CONFIGS = (("static", 0, 8), ("claim", 1, 8), ("claim", 2, 8), ("claim", 4, 8), ("claim", 2, 7), ("claim", 2, 9))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only the check against the float32 reference")
    ap.add_argument("--out", default=None, help="rows (JSON lines)")
    ap.add_argument("--commit", default="")
    ap.add_argument("--diag", action="store_true",
                    help="large chunks (a claim every 8-128 tiles) and the hybrid, fewer split counts")
    args = ap.parse_args()
    if not args.diag:
        check((("static", 0, 8), ("claim", 1, 8), ("claim", 2, 8), ("claim", 4, 8), ("claim", 2, 6), ("claim", 2, 10),
               ("hybrid", 1, 7), ("hybrid", 2, 6)))
    if args.check:
        return
    props = torch.cuda.get_device_properties(0)
    for batch, ctx in SHAPES:
        q, kv, table, lens = problem(batch, ctx)
        copy_us = batch * ctx * D_QK * 2 / 3.02e6  # the latent cache once at ~3020 GB/s (H100 copy)
        split_counts = (4, 8, 16) if batch > 1 else (64, 128)
        if args.diag:
            split_counts = {(32, 4096): (4, 8), (32, 32768): (8,), (128, 4096): (4,), (1, 32768): (128,)}[batch, ctx]
        for splits in split_counts:
            configs = CONFIGS
            if args.diag:  # one claim every 8..128 tiles (down to one a program), and the hybrid
                fair = -(-ctx // 32) // splits
                configs = (("static", 0, 8),) + tuple(("claim", c, 8) for c in (8, 32, 128) if c <= fair) + \
                    (("hybrid", 1, 7), ("hybrid", 1, 6), ("hybrid", 2, 7))
            for kind, chunk, eighths in configs:
                c = Call(q, kv, table, lens, splits, kind, chunk, eighths)
                r = timed(c)
                if kind != "static":
                    r.update(loop_ends(Call(q, kv, table, lens, splits, kind, chunk, eighths, timed=True)))
                row = {"bench": "mla_claim", "commit": args.commit, "device": props.name, "heads": H,
                       "batch": batch, "context": ctx, "splits": splits, "kind": kind, "chunk": chunk,
                       "bound_eighths": eighths,
                       "pct_copy": round(100 * copy_us / r["event_us"], 1),
                       **{k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}}
                print(json.dumps(row), flush=True)
                if args.out:  # a row at a time: a run cut short keeps what it measured
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
