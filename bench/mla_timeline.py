"""Per-program timeline of MLA decode's 16-head latent split kernel (bf16, page 64): an instrumented
copy of kernels/decode/mla_kernel.py's double-buffered latent path (PAGE_AHEAD, 3 stages, 4 warps,
32-token tiles; Triton's JIT, no PDL, no merge). Each program records %smid and %globaltimer at
entry (t0), once its token range is known (t1: seq_len arrived), after the loop (t2: the last
tile's dots done) and after its partial stores are issued (t3). Printed per shape: percentiles over
programs (us from the earliest t0; medians over 20 calls, L2 emptied before each), the event time,
and --sm: each SM's last loop end (sm:us, `*` an SM that ran one program). Partials in fp32 (the
kernel's) or bf16 (--bf16: session 37's 16-bit partials, reverted). A diagnostic: the copy is kept
in step with mla_kernel.py by hand. BENCHMARKS.md, "MLA decode", Where 32 x 4K's time goes.

    python bench/mla_timeline.py [--bf16] [--sm] [--out FILE.json]
"""
import json
import statistics

import torch
import triton
import triton.language as tl

from aotc.kernels.common.schedule import split_program

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _after(x):
    # %globaltimer read once x has arrived (predicated on it, so it cannot issue earlier)
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $1, 2147483647; @p mov.u64 $0, %globaltimer; @!p mov.u64 $0, 0; }",
        "=l,r", [x], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _smid(x):
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [x], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit(do_not_specialize=["max_pages", "stride_table", "q_heads", "group"])
def timed_split(Q, K, Table, SeqLens, PartO, PartLse, Times, sm_scale, page_shift, max_pages, stride_table, q_heads,
                group, stride_qb, stride_qh, stride_kp, stride_kt,
                D_QK: tl.constexpr, D_V: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr):
    t0 = _after(tl.program_id(0))
    b, split, num_splits, kvh, h_mask, heads, lo, hi, _, table_row = split_program(
        SeqLens, Table, SeqLens, 0, 0, max_pages, page_shift, stride_table, group, BLOCK_N, BLOCK_H)
    t1 = _after(hi)
    DT: tl.constexpr = Q.dtype.element_ty
    qk_scale = sm_scale * LOG2E
    q_rows = Q + b.to(tl.int64) * stride_qb + heads[:, None].to(tl.int64) * stride_qh
    offs_a = tl.arange(0, BLOCK_A)
    qa = tl.load(q_rows + offs_a[None, :], mask=h_mask[:, None], other=0.0)
    offs_b = BLOCK_A + tl.arange(0, BLOCK_B)
    qb = tl.load(q_rows + offs_b[None, :], mask=h_mask[:, None], other=0.0)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_A], dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    page_next = tl.load(table_row + ((lo + offs_n) >> page_shift), mask=lo + offs_n < hi, other=0)
    for t0_ in range(lo, hi, BLOCK_N):
        offs_t = t0_ + offs_n
        t_mask = offs_t < hi
        page = page_next.to(tl.int64)
        offs_ahead = offs_t + BLOCK_N
        page_next = tl.load(table_row + (offs_ahead >> page_shift), mask=offs_ahead < hi, other=0)
        slot = (offs_t & ((1 << page_shift) - 1)).to(tl.int64)
        k_row = page * stride_kp + slot * stride_kt
        ka = tl.load(K + k_row[:, None] + offs_a[None, :], mask=t_mask[:, None], other=0)
        qk = tl.dot(qa, tl.trans(ka))
        kb = tl.load(K + k_row[:, None] + offs_b[None, :], mask=t_mask[:, None], other=0)
        qk += tl.dot(qb, tl.trans(kb))
        qk = tl.where(t_mask[None, :], qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
        acc = acc * alpha[:, None] + tl.dot(p.to(DT), ka)
    t2 = _after(tl.sum(l_i, 0).to(tl.int32, bitcast=True))
    slot_ids = (b * q_heads + heads).to(tl.int64) * num_splits + split
    offs_v = tl.arange(0, BLOCK_A)
    inv_l = 1.0 / tl.where(l_i > 0, l_i, 1.0)
    om = (h_mask & (hi > lo))[:, None]
    tl.store(PartO + slot_ids[:, None] * D_V + offs_v[None, :], acc * inv_l[:, None], mask=om)
    lse = tl.where(hi > lo, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    tl.store(PartLse + slot_ids, lse, mask=h_mask)
    t3 = _after(tl.program_id(0))
    pid = (tl.program_id(2) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(0) + tl.program_id(0)
    row = Times + pid.to(tl.int64) * 8
    tl.store(row + 0, _smid(pid).to(tl.int64))
    tl.store(row + 1, t0)
    tl.store(row + 2, t1)
    tl.store(row + 3, t2)
    tl.store(row + 4, t3)


def run(batch, ctx, splits, part_dtype, reps=20):
    PAGE, D_QK, D_V, H = 64, 576, 512, 16
    g = torch.Generator("cuda").manual_seed(0)
    pages_per = max(1, -(-ctx // PAGE))
    kv = torch.randn(batch * pages_per, PAGE, 1, D_QK, generator=g, device="cuda").to(torch.bfloat16)
    table = torch.randperm(batch * pages_per, generator=g, device="cuda").view(batch, pages_per).to(torch.int32)
    q = torch.randn(batch, H, D_QK, generator=g, device="cuda").to(torch.bfloat16)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    part_o = torch.empty(batch * H * splits * D_V, dtype=part_dtype, device="cuda")
    part_lse = torch.empty(batch * H * splits, dtype=torch.float32, device="cuda")
    grid = (1, batch, splits)
    times = torch.zeros(batch * splits, 8, dtype=torch.int64, device="cuda")
    flush = torch.ones(64 << 20, dtype=torch.int32, device="cuda")
    sink = torch.empty((), dtype=torch.int64, device="cuda")

    def call():
        timed_split[grid](q, kv, table, lens, part_o, part_lse, times, 1 / 24, 6, pages_per, table.stride(0), H, H,
                          q.stride(0), q.stride(1), kv.stride(0), kv.stride(1), D_QK=D_QK, D_V=D_V, BLOCK_A=512,
                          BLOCK_B=64, BLOCK_N=32, BLOCK_H=16, num_warps=4, num_stages=3)
    call()
    torch.cuda.synchronize()
    rows, evs = [], []
    for _ in range(reps):
        torch.sum(flush, 0, dtype=torch.int64, out=sink)  # L2 emptied
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        call()
        e.record()
        torch.cuda.synchronize()
        evs.append(s.elapsed_time(e) * 1e3)
        rows.append(times.cpu())

    def pct(x, p):
        x = sorted(x)
        return x[min(len(x) - 1, int(p / 100 * len(x)))]
    stats = {}
    for t in rows:  # each statistic per call, then its median over the calls
        rel = (t[:, 1:5] - int(t[:, 1].min())).double() / 1e3  # us from the first program's entry
        for name, col in (("start", rel[:, 0]), ("seqlen", rel[:, 1] - rel[:, 0]), ("loop", rel[:, 2] - rel[:, 1]),
                          ("epi", rel[:, 3] - rel[:, 2]), ("loopend", rel[:, 2]), ("end", rel[:, 3])):
            for p in (0, 10, 50, 90, 100):
                stats.setdefault(f"{name}_p{p}", []).append(pct(col.tolist(), p))
        sm, ends = t[:, 0], rel[:, 3].tolist()
        cnt = torch.bincount(sm, minlength=132)
        single = [e for e, n in zip(ends, cnt[sm].tolist()) if n == 1]
        double = [e for e, n in zip(ends, cnt[sm].tolist()) if n >= 2]
        stats.setdefault("sms_used", []).append(int((cnt > 0).sum()))
        stats.setdefault("end_single_sm_max", []).append(max(single, default=0.0))
        stats.setdefault("end_double_sm_max", []).append(max(double, default=0.0))
    out = {k: statistics.median(v) for k, v in stats.items()}
    out["event_us"] = statistics.median(evs)
    out["shape"] = f"B{batch}x{ctx} S{splits} {str(part_dtype)[6:]}"
    return out, rows[len(rows) // 2]


SHAPES = ((32, 4096, 8), (32, 32768, 8), (32, 256, 8), (32, 0, 8), (128, 4096, 2), (32, 4096, 4))


def per_sm(raw) -> str:
    """'sm:us' of each SM's last loop end (t2) in one call, '*' where the SM ran one program."""
    base = int(raw[:, 1].min())
    last, count = {}, {}
    for sm, t2 in zip(raw[:, 0].tolist(), raw[:, 3].tolist()):
        last[sm] = max(last.get(sm, 0.0), (t2 - base) / 1e3)
        count[sm] = count.get(sm, 0) + 1
    return " ".join(f"{sm}:{last[sm]:.0f}{'*' if count[sm] == 1 else ''}" for sm in sorted(last))


def main():
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bf16", action="store_true", help="also each shape with bf16 partials")
    ap.add_argument("--sm", action="store_true", help="print each SM's last loop end (32 x 4K and 32 x 32K)")
    ap.add_argument("--out", default=None, help="write the summaries as JSON")
    args = ap.parse_args()
    res = []
    for batch, ctx, splits in SHAPES:
        for dt in (torch.float32, torch.bfloat16) if args.bf16 else (torch.float32,):
            r, raw = run(batch, ctx, splits, dt)
            res.append(r)
            print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}), flush=True)
            if args.sm and dt == torch.float32 and batch == 32 and splits == 8 and ctx >= 4096:
                print(f"  per SM, B{batch}x{ctx}: {per_sm(raw)}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
