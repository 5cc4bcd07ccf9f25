"""Which read of decode's quantized caches reaches the copy bandwidth? No-math reads of aotc's own
int8/int4 layouts (codes [pages, page, kv_heads, bytes] token-major or [pages, kv_heads, page, bytes]
head-major, bf16 scales [.., groups] beside them) through random page tables, L2 emptied, varying
what decode's grid fixes: KV heads a program, tokens a tile, warps, stages, programs an SM (splits),
how the page table and the scales are read. % of copy: codes + scales read once over the call's
time against the device-to-device copy bandwidth of the same run (harness.copy_bandwidth).

Every timed launch is checked: each program adds up the int32 words (int16 scales) it read and the
programs' sum must equal the sum over the cache region the tables cover (each token read once).

A sweep, coordinate by coordinate, on the 8K-token shapes of issue 40 (32 query / 8 KV heads, D 128):
structure (heads a program x tokens a tile x programs an SM), then launch (warps x stages), then
the streams (table x scales), then the best of each format beside decode's own pattern and
bench_decode's `ceiling` kernel at batch 32 / 128, page 16 / 64, token- and head-major. Kernels
are compiled ahead of each stage by a pool of processes (Triton's file cache), so the timed
process only loads them (on an H100: ~80 s, 850 timed configurations). `--quick`: a few
configurations, a smoke run. Findings: BENCHMARKS.md, "Tried and not kept", Decode: several KV heads
a program; the read kernel's CPU test: tests/cpu/bench/test_probe_decode_read.py."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import triton
import triton.language as tl

from aotc.kernels.decode.kernel import _pages_nc  # TABLE 1: the table read the pipeliner does not see

H = 8  # KV heads
SM_COUNT = 132


@triton.jit
def _codes(K, V, page, offs, m, page_shift, g, cols, ps, ss, hs, W: tl.constexpr, HEADS: tl.constexpr):
    # K + V int32 words of tokens offs, KV heads [g * HEADS, (g + 1) * HEADS): [len(offs), HEADS * W].
    slot = (offs & ((1 << page_shift) - 1)).to(tl.int64)
    row = page * ps + slot * ss + (g * HEADS).to(tl.int64) * hs
    col = (cols // W).to(tl.int64) * hs + cols % W
    mm = m[:, None]
    return tl.load(K + row[:, None] + col[None, :], mask=mm, other=0) + \
        tl.load(V + row[:, None] + col[None, :], mask=mm, other=0)


@triton.jit
def _scales(KS, VS, page, offs, m, page_shift, g, sps, sss, shs, GS: tl.constexpr, HEADS: tl.constexpr):
    # K + V int16 scales of the same tokens and heads, as int32: [len(offs)] for one scale a token
    # (GS * HEADS == 1, decode's per-token vector), else [len(offs), HEADS * GS].
    slot = (offs & ((1 << page_shift) - 1)).to(tl.int64)
    row = page * sps + slot * sss + (g * HEADS).to(tl.int64) * shs
    if GS * HEADS == 1:
        return tl.load(KS + row, mask=m, other=0).to(tl.int32) + tl.load(VS + row, mask=m, other=0).to(tl.int32)
    else:
        sc = tl.arange(0, HEADS * GS)
        col = (sc // GS).to(tl.int64) * shs + sc % GS
        mm = m[:, None]
        return tl.load(KS + row[:, None] + col[None, :], mask=mm, other=0).to(tl.int32) + \
            tl.load(VS + row[:, None] + col[None, :], mask=mm, other=0).to(tl.int32)


@triton.jit(do_not_specialize=["ctx", "max_pages", "page_shift", "chunk"])
def read_kernel(K, V, KS, VS, Table, Out, ctx, max_pages, page_shift, chunk, ps, ss, hs, sps, sss, shs,
                W: tl.constexpr, GS: tl.constexpr, HEADS: tl.constexpr, BLOCK_N: tl.constexpr,
                TABLE: tl.constexpr, SCALES: tl.constexpr, STAGES: tl.constexpr):
    # Program (g, b, s): KV heads [g * HEADS, (g + 1) * HEADS) of request b, tokens [s * chunk, ..).
    # K, V: int32 words, a token-head row W of them at strides ps (page), ss (token), hs (head);
    # KS, VS: int16 scales, GS a token-head row, strides sps, sss, shs. TABLE 2: the next tile's page
    # ids loaded a tile ahead (a loop-carried load). SCALES 0: none read; 1: in the tile's iteration;
    # 2: a tile ahead into registers (decode's _attend_chunked). STAGES > 1: the loop's loads become
    # cp.async copies STAGES - 1 tiles ahead (tl.range; a plain range leaves loads that feed no dot
    # as register loads). Out[program]: the sum of its words.
    g = tl.program_id(0)
    b = tl.program_id(1)
    s = tl.program_id(2)
    lo = s * chunk
    hi = tl.minimum(lo + chunk, ctx)
    table_row = Table + b.to(tl.int64) * max_pages
    cols = tl.arange(0, HEADS * W)
    acc = tl.zeros([BLOCK_N, HEADS * W], dtype=tl.int32)
    if GS * HEADS == 1:
        sacc = tl.zeros([BLOCK_N], dtype=tl.int32)
    else:
        sacc = tl.zeros([BLOCK_N, HEADS * GS], dtype=tl.int32)
    offs_n = lo + tl.arange(0, BLOCK_N)
    page_n = _pages_nc(table_row, offs_n, hi, page_shift, False)
    if SCALES == 2:
        sc = _scales(KS, VS, page_n, offs_n, offs_n < hi, page_shift, g, sps, sss, shs, GS, HEADS)
    for t0 in tl.range(lo, hi, BLOCK_N, num_stages=STAGES):
        offs = t0 + tl.arange(0, BLOCK_N)
        m = offs < hi
        if TABLE == 2:
            page = page_n
            page_n = _pages_nc(table_row, offs + BLOCK_N, hi, page_shift, False)
        else:
            page = _pages_nc(table_row, offs, hi, page_shift, TABLE == 1)
        acc += _codes(K, V, page, offs, m, page_shift, g, cols, ps, ss, hs, W, HEADS)
        if SCALES == 1:
            sacc += _scales(KS, VS, page, offs, m, page_shift, g, sps, sss, shs, GS, HEADS)
        elif SCALES == 2:
            sacc += sc
            if TABLE != 2:
                page_n = _pages_nc(table_row, offs + BLOCK_N, hi, page_shift, False)
            sc = _scales(KS, VS, page_n, offs + BLOCK_N, offs + BLOCK_N < hi, page_shift, g, sps, sss, shs, GS,
                         HEADS)
    pid = (b * tl.num_programs(0) + g) * tl.num_programs(2) + s
    tl.store(Out + pid, tl.sum(tl.sum(acc, 1), 0) + tl.sum(tl.reshape(sacc, [sacc.numel]), 0))


# (name, words of a token-head row (int32), int16 scales a token-head row)
FORMATS = {"int8": (32, 1), "int4": (16, 1), "int4g8": (16, 16), "bf16": (64, 0)}
LABEL = {"int8": "int8 group128", "int4": "int4 group128", "int4g8": "int4 group8", "bf16": "bf16"}


class Caches:
    """One format's K, V (int32 words) and scales (int16) for `tokens` tokens, random bits; page
    tables are made per (batch, context, page) over the first batch * context tokens. `bound`: the
    words' magnitude (small under the interpreter, whose int32 sums do not wrap)."""

    def __init__(self, fmt, tokens, device, bound=2**31 - 1):
        import torch

        self.fmt, self.device = fmt, device
        self.W, self.GS = FORMATS[fmt]
        words = tokens * H * self.W
        self.K = torch.randint(-bound, bound, (words,), dtype=torch.int32, device=device)
        self.V = torch.randint(-bound, bound, (words,), dtype=torch.int32, device=device)
        n = max(1, tokens * H * self.GS)
        sb = min(bound, 2**15 - 1)
        self.KS = torch.randint(-sb, sb, (n,), dtype=torch.int16, device=device)
        self.VS = torch.randint(-sb, sb, (n,), dtype=torch.int16, device=device)
        self._sums = {}

    def row_bytes(self):
        return 4 * self.W + 2 * self.GS

    def nbytes(self, tokens, scales=True):
        return 2 * tokens * H * (4 * self.W + (2 * self.GS if scales else 0))

    def expected(self, tokens, scales):
        """The int32 (wrapped) sum of the words, and scales if read, of the first `tokens` tokens."""
        key = (tokens, scales)
        if key not in self._sums:
            w = tokens * H * self.W
            total = int(self.K[:w].sum(dtype=self._i64())) + int(self.V[:w].sum(dtype=self._i64()))
            if scales and self.GS:
                n = tokens * H * self.GS
                total += int(self.KS[:n].sum(dtype=self._i64())) + int(self.VS[:n].sum(dtype=self._i64()))
            self._sums[key] = total % 2**32
        return self._sums[key]

    @staticmethod
    def _i64():
        import torch

        return torch.int64

    def table(self, batch, ctx, page, seed=0):
        import torch

        gen = torch.Generator(device="cpu").manual_seed(seed)
        pages = batch * ctx // page
        return torch.randperm(pages, generator=gen, dtype=torch.int32).view(batch, ctx // page).to(self.device)

    def strides(self, page, layout):
        return strides(self.W, self.GS, page, layout)


def strides(W, GS, page, layout):
    """(ps, ss, hs) in words and (sps, sss, shs) in scales: token-major [pages, page, H, row] or
    head-major [pages, H, page, row]."""
    GS = max(1, GS)
    if layout == "nhd":
        return (page * H * W, H * W, W), (page * H * GS, H * GS, GS)
    return (page * H * W, W, page * W), (page * H * GS, GS, page * GS)


def splits_for(batch, heads, programs_per_sm, ctx, block_n):
    base = (H // heads) * batch
    return max(1, min(ctx // block_n, round(programs_per_sm * SM_COUNT / base)))


def kernel_args(c: Caches, table, ctx, page, cfg, splits, out):
    (ps, ss, hs), (sps, sss, shs) = c.strides(page, cfg["layout"])
    per_split = -(-ctx // splits)
    chunk = -(-per_split // cfg["block_n"]) * cfg["block_n"]
    args = (c.K, c.V, c.KS, c.VS, table, out, ctx, table.shape[1], page.bit_length() - 1, chunk,
            ps, ss, hs, sps, sss, shs)
    kw = dict(W=c.W, GS=max(1, c.GS), HEADS=cfg["heads"], BLOCK_N=cfg["block_n"], TABLE=cfg["table"],
              SCALES=cfg["scales"] if c.GS else 0, STAGES=cfg["stages"], num_warps=cfg["warps"],
              num_stages=cfg["stages"])
    return args, kw


def _warm(job):
    """Compile one configuration into Triton's file cache (a pool worker; no launch). The stride
    arguments are specialized (== 1, multiples of 16) as the timed launch's are; page 16 and 64
    specialize alike."""
    import torch

    fmt, cfg, kernel = job
    W, GS = FORMATS[fmt]
    t0 = time.time()
    try:
        if kernel == "ceiling":
            from bench_decode import stream_kernel

            i16 = torch.int16
            stream_kernel.warmup(i16, i16, i16, i16, torch.int32, torch.int32, 8192, 512, H, 2 * W, GS, 1,
                                 cfg["page"], 128, num_warps=4, num_stages=2, grid=(1,))
        else:
            kw = dict(W=W, GS=max(1, GS), HEADS=cfg["heads"], BLOCK_N=cfg["block_n"], TABLE=cfg["table"],
                      SCALES=cfg["scales"] if GS else 0, STAGES=cfg["stages"], num_warps=cfg["warps"],
                      num_stages=cfg["stages"])
            (ps, ss, hs), (sps, sss, shs) = strides(W, GS, 16, cfg["layout"])
            read_kernel.warmup(torch.int32, torch.int32, torch.int16, torch.int16, torch.int32, torch.int32,
                               8192, 512, 4, 1024, ps, ss, hs, sps, sss, shs, grid=(1,), **kw)
    except Exception as e:  # noqa: BLE001 - reported by the timed process, which compiles it again
        return f"{fmt} {cfg}: {type(e).__name__}: {e}"
    return time.time() - t0


class Probe:
    """The timed process. device "cpu": a dry run of the sweep's logic under TRITON_INTERPRET (no
    pool, no L2, a made-up copy bandwidth and host times)."""

    def __init__(self, out_dir, budget_s, reps_ms, pool_size, device="cuda"):
        import torch

        self.torch, self.device = torch, device
        self.out_dir, self.budget, self.reps_ms = out_dir, budget_s, reps_ms
        self.t_start = time.time()
        self.rows = []
        self.caches = {}
        self.tables = {}
        self.seen = {}
        self.pool = None
        self.out = torch.empty(1 << 20, dtype=torch.int32, device=device)
        from harness import provenance

        self.meta = provenance()
        if device == "cpu":
            self.copy, self.flush = 1e12, None
            return
        from harness import L2Flush, copy_bandwidth

        self.copy = copy_bandwidth()
        print(f"device-to-device copy: {self.copy / 1e9:.0f} GB/s (read + write)", flush=True)
        self.write(dict(self.meta, op="copy", variant="-", provider="torch_copy", shape="2GiB", metric="GBps",
                        value=self.copy / 1e9))
        self.flush = L2Flush("clean")
        if pool_size > 1:
            import multiprocessing as mp

            self.pool = mp.get_context("spawn").Pool(pool_size)

    def sync(self):
        if self.device != "cpu":
            self.torch.cuda.synchronize()

    def elapsed(self):
        return time.time() - self.t_start

    def cache(self, fmt, tokens):
        if fmt not in self.caches:
            for other in list(self.caches):
                del self.caches[other]
            self.tables.clear()
            if self.device == "cpu":
                self.caches[fmt] = Caches(fmt, tokens, "cpu", bound=1000)
            else:
                self.torch.cuda.empty_cache()
                self.caches[fmt] = Caches(fmt, tokens, "cuda")
        return self.caches[fmt]

    def warm(self, fmt, cfgs, kernel="read"):
        if not self.pool:
            return
        t0 = time.time()
        res = self.pool.map(_warm, [(fmt, c, kernel) for c in cfgs])
        errs = [r for r in res if isinstance(r, str)]
        for e in errs:
            print("compile error:", e, flush=True)
        print(f"[{self.elapsed():6.1f}s] compiled {len(cfgs)} {fmt} configs in {time.time() - t0:.1f}s", flush=True)

    def time_fn(self, fn):
        torch = self.torch
        if self.device == "cpu":
            t0 = time.time()
            fn()
            return time.time() - t0
        fn()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        one = e0.elapsed_time(e1)
        reps = int(min(100, max(15, self.reps_ms / max(one, 1e-3))))
        st = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        en = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            self.flush()
            st[i].record()
            fn()
            en[i].record()
        torch.cuda.synchronize()
        t = sorted(s.elapsed_time(e) for s, e in zip(st, en))
        return t[len(t) // 2] * 1e-3

    def measure(self, stage, fmt, shape, cfg, splits=None, kernel="read"):
        """Times one configuration; returns % of copy (None if it failed)."""
        batch, ctx, page = shape
        c = self.cache(fmt, max(b * t for b, t, _ in SHAPES + FINAL_SHAPES))
        tk = (batch, ctx, page)
        if tk not in self.tables:
            self.tables[tk] = c.table(batch, ctx, page)
        table = self.tables[tk]
        scales = bool(c.GS) and (kernel != "read" or cfg["scales"] != 0)
        if kernel == "ceiling":  # bench_decode.py's layout ceiling, one KV head a program, decode's grid
            from bench_decode import stream_kernel

            splits = splits or 1
            grid = (H, batch, splits)
            k16 = c.K.view(self.torch.int16)
            v16 = c.V.view(self.torch.int16)
            G = c.GS
            ks, vs = (c.KS, c.VS) if G else (k16, v16)
            fn = lambda: stream_kernel[grid](k16, v16, ks, vs, table, self.out, ctx, table.shape[1],  # noqa: E731
                                             H, 2 * c.W, G, 1, page, 128, num_warps=4, num_stages=2)
            cfg = dict(cfg, heads=1, block_n=128, warps=4, stages=2)
        else:
            splits = splits or splits_for(batch, cfg["heads"], cfg["pps"], ctx, cfg["block_n"])
            grid = (H // cfg["heads"], batch, splits)
            args, kw = kernel_args(c, table, ctx, page, cfg, splits, self.out)
            fn = lambda: read_kernel[grid](*args, **kw)  # noqa: E731
        n = grid[0] * grid[1] * grid[2]
        seen = (stage, fmt, shape, kernel, splits, json.dumps({k: v for k, v in cfg.items() if k != "pps"},
                                                              sort_keys=True))
        if seen in self.seen:  # another programs-an-SM target that gives the same split count
            return self.seen[seen]
        try:
            self.out[:n].fill_(0)
            t0 = time.time()
            fn()
            self.sync()
            first = time.time() - t0
            got = int(self.out[:n].to(self.torch.int64).sum()) % 2**32
            want = c.expected(batch * ctx, scales) if kernel == "read" else None
            if want is not None and got != want:
                print(f"WRONG SUM {stage} {fmt} {shape} {cfg} splits {splits}: {got} != {want}", flush=True)
                return None
            t = self.time_fn(fn)
        except Exception as e:  # noqa: BLE001 - one configuration that fails is reported, not fatal
            print(f"FAILED {stage} {fmt} {shape} {cfg}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            return None
        nbytes = c.nbytes(batch * ctx, scales)
        pct = 100 * nbytes / t / self.copy
        knobs = {k: cfg[k] for k in BASE if k != "pps"}
        row = dict(self.meta, op="decode_read_probe", variant=LABEL[fmt],
                   provider=f"{kernel} " + " ".join(f"{k}={v}" for k, v in knobs.items()),
                   shape=f"b{batch} ctx{ctx} h32/{H} d128 page{page}", metric="pct_of_copy", value=pct,
                   stage=stage, fmt=fmt, batch=batch, ctx=ctx, page=page, kernel=kernel, splits=splits,
                   programs=n, us=t * 1e6, pct=pct, first_s=first, **cfg)
        self.rows.append(row)
        self.seen[seen] = pct
        self.write(row)
        return pct

    def write(self, row):
        with open(os.path.join(self.out_dir, "probe_rows.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")


BASE = dict(heads=1, block_n=128, warps=4, stages=2, table=0, scales=1, layout="nhd", pps=6)
SHAPES = [(32, 8192, 16), (128, 8192, 16)]
FINAL_SHAPES = [(32, 8192, 16), (32, 8192, 64), (128, 8192, 16), (128, 8192, 64)]
# Decode's own read of each format (kernels/decode/spec.py's split_launch and tiles; the scales a
# tile ahead, int4 per group's table through ld.global.nc) and the programs an SM its binary fits,
# from which spec.num_splits derives the split count.
DECODE = {
    "int8": (dict(BASE, scales=2, pps=0), 3),
    "int4": (dict(BASE, block_n=64, warps=2, stages=3, scales=2, pps=0), 6),
    "int4g8": (dict(BASE, stages=3, table=1, scales=2, pps=0), 3),
    "bf16": (dict(BASE, scales=0, pps=0), 2),
}


def structures(fmt):
    W, GS = FORMATS[fmt]
    row = 4 * W
    for heads in (1, 2, 4, 8):
        for bn in (16, 32, 64, 128, 256):
            if 2048 <= bn * heads * row <= 32768:
                yield dict(BASE, heads=heads, block_n=bn)


def ranked(p, fmt, stages, shapes, where=lambda r: True):
    """Configurations timed at every shape of `shapes` in `stages`, best mean % of copy first."""
    by = {}
    for r in p.rows:
        if r["fmt"] == fmt and r["stage"] in stages and r["kernel"] == "read" and r["scales"] != 0 and where(r) \
                and (r["batch"], r["ctx"], r["page"]) in shapes:
            cfg = json.dumps({k: r[k] for k in BASE}, sort_keys=True)
            by.setdefault(cfg, {})[(r["batch"], r["page"])] = r["pct"]
    full = [(sum(v.values()) / len(v), k) for k, v in by.items() if len(v) == len(shapes)]
    return [json.loads(k) for _, k in sorted(full, reverse=True)]


def run(p: Probe, formats, quick=False):
    shapes = SHAPES[:1] if quick else SHAPES
    sweep = ("structure", "launch", "streams", "programs")

    def step(stage, fmt, cfgs):
        """One stage of the sweep: `cfgs` (two of them when quick) compiled, then timed at every shape."""
        cfgs = cfgs[:2] if quick else cfgs
        p.warm(fmt, cfgs)
        for cfg in cfgs:
            for shape in shapes:
                p.measure(stage, fmt, shape, cfg)

    for fmt in formats:
        # 1. structure: KV heads a program x tokens a tile x programs an SM, register loads (1 stage)
        # and a cp.async ring (3 stages)
        cfgs = [dict(c, stages=st) for c in structures(fmt) for st in (1, 3)]
        if quick:
            cfgs = cfgs[:2]
        p.warm(fmt, cfgs)
        for cfg in cfgs:
            for pps in ((6,) if quick else (4, 8, 16)):
                for shape in shapes:
                    p.measure("structure", fmt, shape, dict(cfg, pps=pps))
        top = ranked(p, fmt, sweep, shapes)[:2] or [BASE]
        print(f"[{p.elapsed():6.1f}s] {fmt} structure best: {top}", flush=True)
        if p.elapsed() > p.budget * 0.6 and not quick:
            continue
        # 2. launch: warps x stages on the two best
        cfgs = [dict(t, warps=w, stages=st) for t in top for w in (2, 4, 8) for st in (1, 2, 3, 4)
                if (w, st) != (t["warps"], t["stages"])]
        step("launch", fmt, cfgs)
        b0 = (ranked(p, fmt, sweep, shapes) or top)[0]
        print(f"[{p.elapsed():6.1f}s] {fmt} launch best: {b0}", flush=True)
        # 3. streams (table read x scale read), then programs an SM
        cfgs = [dict(b0, table=t, scales=sc) for t in (0, 1, 2) for sc in ((0, 1, 2) if FORMATS[fmt][1] else (1,))
                if (t, sc) != (b0["table"], b0["scales"])]
        step("streams", fmt, cfgs)
        b0 = (ranked(p, fmt, sweep, shapes) or top)[0]
        for pps in (() if quick else (2, 3, 4, 6, 8, 12, 16, 24, 32)):
            for shape in shapes:
                p.measure("programs", fmt, shape, dict(b0, pps=pps))
    # 4. final: each format's best, its best at one KV head a program (decode's grid), decode's own
    # read and bench_decode's ceiling kernel, at 4 shapes, token- and head-major
    from aotc.kernels.decode.spec import num_splits

    for fmt in formats + [f for f in ("bf16",) if f not in formats]:
        best = (ranked(p, fmt, sweep, shapes) or ranked(p, "int8", sweep, shapes) or [BASE])[0]
        one = (ranked(p, fmt, sweep, shapes, lambda r: r["heads"] == 1) or [BASE])[0]
        decode_like, occupancy = DECODE[fmt]
        p.warm(fmt, [best, dict(best, layout="hnd"), one, decode_like, dict(decode_like, layout="hnd")])
        p.warm(fmt, [dict(page=page) for page in sorted({s[2] for s in FINAL_SHAPES})], kernel="ceiling")
        print(f"[{p.elapsed():6.1f}s] {fmt} final: best {best}, one head {one}", flush=True)
        for shape in (FINAL_SHAPES[:1] if quick else FINAL_SHAPES):
            dsplits = num_splits(shape[0], H, 4, SM_COUNT, programs_per_sm=occupancy)
            p.measure("final", fmt, shape, dict(BASE, pps=0), splits=dsplits, kernel="ceiling")
            p.measure("final", fmt, shape, decode_like, splits=dsplits)
            p.measure("final", fmt, shape, dict(decode_like, layout="hnd"), splits=dsplits)
            p.measure("final", fmt, shape, one)
            p.measure("final", fmt, shape, best)
            p.measure("final", fmt, shape, dict(best, layout="hnd"))


def table(rows):
    lines = ["stage fmt batch page kernel layout heads block_n warps stages table scales splits programs us pct"]
    for r in rows:
        lines.append(f"{r['stage']:9s} {r['fmt']:6s} {r['batch']:4d} {r['page']:3d} {r['kernel']:7s} {r['layout']} "
                     f"{r['heads']} {r['block_n']:3d} {r['warps']} {r['stages']} {r['table']} {r['scales']} "
                     f"{r['splits']:4d} {r['programs']:5d} {r['us']:8.1f} {r['pct']:6.1f}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".", help="folder for probe_rows.jsonl and probe_table.txt")
    ap.add_argument("--formats", default="int8,int4,int4g8")
    ap.add_argument("--budget", type=float, default=150.0, help="seconds: later stages shrink past half of it")
    ap.add_argument("--reps-ms", type=float, default=30.0)
    ap.add_argument("--pool", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    p = Probe(a.out, a.budget, a.reps_ms, a.pool)
    try:
        run(p, a.formats.split(","), quick=a.quick)
    finally:
        if p.pool:
            p.pool.terminate()
        text = table(p.rows)
        with open(os.path.join(a.out, "probe_table.txt"), "w") as f:
            f.write(text + "\n")
        # the last screen: the final stage
        print(table([r for r in p.rows if r["stage"] == "final"]))
        print(f"total {p.elapsed():.1f}s")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import probe_decode_read

    probe_decode_read.main()
