"""What vllm.chunked_prefill_paged_decode's one-call design costs on decode rows.

aotc.compat.vllm.chunked_prefill_paged_decode runs one prefix_prefill call in which a request with
one new token is a prefill row (a 128-row query tile per query head, one row used). This measures,
side by side in one run, on decode-heavy vLLM batches (bf16, 32/8 heads, D 128, block 16, vLLM's
x-packed layout with x = 8):
  one_call    prefix_prefill over the whole batch (what the compat function launches; validate off)
  decode      loader.decode over the decode rows alone, on the same values in the nhd layout (the
              fastest way aotc has to attend one token; it does not read the x-packed layout)
  prefill     prefix_prefill with skip_decode=True (the prefill rows alone: 0 without any)
  ceiling     the decode rows' K/V bytes over the device-to-device copy bandwidth of this run
and prints one_call / (prefill + decode): above 1, splitting the batch into a prefill call and a
decode call would be faster, by that factor; and decode's share of the ceiling. Times: medians of CUDA-event
timings, the L2 emptied before each call (harness.device_time). Rows: JSON lines at --out.
    python3 bench_compat_decode_rows.py [--out results.jsonl]
"""
from __future__ import annotations

import torch

from aotc import loader
from aotc.loader.ops.prefix_prefill import prefix_prefill
from harness import device_time, start

HEADS, KV_HEADS, D, BS, DTYPE = 32, 8, 128, 16, torch.bfloat16
DEV = "cuda"
# (name, [(context, new tokens)] per request): decode rows have one new token
SHAPES = [
    ("64 decode rows ctx4096", [(4095, 1)] * 64),
    ("256 decode rows ctx1024", [(1023, 1)] * 256),
    ("8 decode rows ctx16384", [(16383, 1)] * 8),
    ("64 decode rows ctx4096 + prefill 2048+512", [(4095, 1)] * 64 + [(2048, 512)]),
]


def make(reqs):
    ctx = [c for c, _ in reqs]
    new = [n for _, n in reqs]
    seq = [c + n for c, n in reqs]
    pages = [-(-s // BS) for s in seq]  # the decode path reads the new token from the cache too
    nb = sum(pages)
    k = torch.randn(nb, BS, KV_HEADS, D, device=DEV).to(DTYPE)
    v = torch.randn(nb, BS, KV_HEADS, D, device=DEV).to(DTYPE)
    table = torch.zeros(len(reqs), max(pages), dtype=torch.int32, device=DEV)
    perm = torch.randperm(nb, device=DEV).to(torch.int32)
    i = 0
    for b, p in enumerate(pages):
        table[b, :p] = perm[i:i + p]
        i += p
    x = 8
    k_vllm = k.view(nb, BS, KV_HEADS, D // x, x).permute(0, 2, 3, 1, 4).contiguous()
    v_vllm = v.permute(0, 2, 3, 1).contiguous()
    tokens = sum(new)
    q = torch.randn(tokens, HEADS, D, device=DEV).to(DTYPE)
    kn = torch.randn(tokens, KV_HEADS, D, device=DEV).to(DTYPE)
    vn = torch.randn(tokens, KV_HEADS, D, device=DEV).to(DTYPE)
    qsl = torch.tensor([0] + torch.tensor(new).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    seq_t = torch.tensor(seq, dtype=torch.int32, device=DEV)
    dec = [b for b, n in enumerate(new) if n == 1]
    dec_rows = qsl[:-1][dec].long()
    return dict(k=k, v=v, k_vllm=k_vllm, v_vllm=v_vllm, table=table, q=q, kn=kn, vn=vn, qsl=qsl, seq=seq_t,
                dec=dec, dec_rows=dec_rows, dec_bytes=2 * sum(seq[b] for b in dec) * KV_HEADS * D * 2)


def main():
    rows, copy_bw = start(__doc__.splitlines()[0])
    print(f"{'shape':44s} {'one_call us':>12s} {'prefill us':>11s} {'decode us':>10s} {'one/(pre+dec)':>14s} "
          f"{'decode % ceil':>14s}")
    for name, reqs in SHAPES:
        m = make(reqs)
        out = torch.empty_like(m["q"])
        q_dec = m["q"][m["dec_rows"]].contiguous()
        out_dec = torch.empty_like(q_dec)
        table_dec, seq_dec = m["table"][m["dec"]].contiguous(), m["seq"][m["dec"]].contiguous()

        def one_call():
            prefix_prefill(m["q"], m["kn"], m["vn"], m["k_vllm"], m["v_vllm"], m["table"], m["qsl"], m["seq"],
                           kv_layout="vllm", out=out, validate=False)

        def prefill_rows():
            prefix_prefill(m["q"], m["kn"], m["vn"], m["k_vllm"], m["v_vllm"], m["table"], m["qsl"], m["seq"],
                           kv_layout="vllm", out=out, skip_decode=True, validate=False)

        def decode_rows():
            loader.decode(q_dec, m["k"], m["v"], table_dec, seq_dec, out=out_dec, validate=False)

        prefill = len(m["dec"]) < len(reqs)
        t_one, t_dec = device_time(one_call), device_time(decode_rows)
        t_pre = device_time(prefill_rows) if prefill else 0.0
        ceil = m["dec_bytes"] / copy_bw
        for provider, t in (("one_call", t_one), ("prefill", t_pre), ("decode", t_dec), ("ceiling", ceil)):
            rows.add("compat_chunked_prefill_paged_decode", "bf16 d128 vllm-layout", provider, name, "seconds", t)
        print(f"{name:44s} {t_one * 1e6:12.1f} {t_pre * 1e6:11.1f} {t_dec * 1e6:10.1f} "
              f"{t_one / (t_pre + t_dec):14.2f} {100 * ceil / t_dec:13.1f}%")


if __name__ == "__main__":
    main()
