"""Every op once at its edge shapes, for compute-sanitizer (tests/gpu/sanitize.sh runs it under
memcheck, racecheck and initcheck). Not a pytest file: `python tests/gpu/sanitizer_cases.py [--op OP]`.

Edge shapes: lengths 0, 1, block-1, block+1 and one request using every page of its table row
(the maximal page count), padded rows (decode: req_idx into a table with spare rows; gated delta:
state index -1), block-edge prefill contexts and new-token counts. Every output is poisoned with
NaN first and must come back finite, so an element the kernel never wrote is caught here too
(initcheck catches a kernel reading memory nobody wrote). Runs the AOT binaries of the default
artifacts (`aotc build --arch sm90` first); prints one line per case and "ok N cases".
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))  # tests.cpu.* case builders

from aotc.kernels.decode import spec as DS  # noqa: E402
from aotc.loader.ops.decode import decode  # noqa: E402
from aotc.loader.ops.gated_delta import gated_delta_decode  # noqa: E402
from aotc.loader.ops.prefix_prefill import prefix_prefill  # noqa: E402
from aotc.loader.ops.store_kv import store_kv  # noqa: E402


DEVICE = "cuda"


def _finite(name: str, out: torch.Tensor) -> None:
    if out.is_cuda:
        torch.cuda.synchronize()
    bad = (~torch.isfinite(out.float())).sum().item()
    print(f"{name}: {tuple(out.shape)} {'ok' if not bad else f'{bad} elements never written or non-finite'}",
          flush=True)
    if bad:
        raise SystemExit(f"{name}: {bad} output elements are NaN after the call (unwritten?)")


def decode_cases() -> int:
    from tests.cpu.kernels.decode.cases import make_case

    n = 0
    for fmt, head_dim, group in (("bf16", 128, 32), ("fp16", 64, 32), ("int8", 128, 32), ("int8", 128, 128),
                                 ("int4", 128, 32), ("int4", 64, 64), ("fp8_e4m3", 128, 32)):
        axes = DS.split_axes(fmt if fmt in ("fp16", "bf16") else "bf16", fmt, "fp16" if fmt in DS.INT_FORMATS else "fp32", head_dim,
                             fmt in DS.INT_FORMATS and group == head_dim, group)
        block = DS.block_n(head_dim, DS.split_tiles(fmt, head_dim, axes["scales"])[0])
        lens = [0, 1, block - 1, block + 1, 3 * block]  # the last uses every page of its row
        case = make_case(lens, fmt=fmt, head_dim=head_dim, quant_group=group, kv_heads=2, group=4, page_size=16,
                         req_idx=True, device=DEVICE, seed=n)
        for kw in ({}, {"num_splits": 1}, {"window": block + 1}):
            out = torch.full_like(case.q, float("nan"))
            decode(case.q, case.k_cache, case.v_cache, case.table, case.seq_lens, out=out, **case.kwargs, **kw)
            _finite(f"decode {fmt} d{head_dim} g{group} lens {lens} {kw}", out)
            n += 1
    return n


def store_kv_cases() -> int:
    from tests.cpu.kernels.decode.cases import empty_cache

    n = 0
    for fmt in ("bf16", "int8", "int4", "fp8_e4m3"):
        k_cache, v_cache = empty_cache(fmt, 4, 16, 2, 128, DEVICE, torch.bfloat16, False)
        kw = {}
        if fmt in ("int8", "int4"):
            kw = {"k_scale": torch.zeros(4, 16, 2, 4, dtype=torch.float16, device=DEVICE),
                  "v_scale": torch.zeros(4, 16, 2, 4, dtype=torch.float16, device=DEVICE)}
        for tokens in (0, 1, 64):  # none, one, every slot of the cache
            k = torch.randn(tokens, 2, 128, device=DEVICE, dtype=torch.bfloat16)
            slots = torch.randperm(64, device=DEVICE)[:tokens].to(torch.int32)
            store_kv(k, k, k_cache, v_cache, slots, **kw)
            print(f"store_kv {fmt} tokens {tokens}: ok", flush=True)
            n += 1
    return n


def prefix_prefill_cases() -> int:
    from tests.cpu.kernels.prefix_prefill.cases import make_case

    n = 0
    for head_dim, layout, quant in ((64, "nhd", {}), (128, "nhd", {}), (128, "vllm", {}),
                                    (128, "hnd", dict(kv_format="int8", scales="token")),
                                    (64, "nhd", dict(kv_format="int4", scales="group", group=8)),
                                    (128, "hnd", dict(kv_format="int8", scales="channel"))):
        ctx = [0, 1, 15, 17, 64]
        new = [1, 16, 15, 17, 1]
        case, kw = make_case(ctx, new, q_heads=4, kv_heads=2, head_dim=head_dim, block_size=16, layout=layout,
                             dtype=torch.bfloat16, device=DEVICE, seed=n, **quant)
        out = torch.full_like(case["q"], float("nan"))
        prefix_prefill(*case.values(), out=out, **kw)
        _finite(f"prefix_prefill d{head_dim} {layout} {quant.get('kv_format', '')}{quant.get('scales', '')} "
                f"ctx {ctx} new {new}", out)
        n += 1
    return n


def gated_delta_cases() -> int:
    from tests.cpu.kernels.gated_delta.cases import make_case

    n = 0
    for T, K, V, kda, fused, layout in ((1, 128, 128, False, False, "vmajor"), (8, 128, 128, True, False, "vmajor"),
                                        (2, 64, 64, False, True, "kmajor"), (1, 256, 64, True, True, "vmajor")):
        args, kw = make_case(B=4, T=T, H=2, HV=4, K=K, V=V, kda=kda, fused=fused, layout=layout, pads=(1, 3),
                             device=DEVICE, seed=n)
        q, v = args["q"], args["v"]
        out = torch.full((*q.shape[:2], *v.shape[2:]), float("nan"), dtype=q.dtype, device=DEVICE)
        gated_delta_decode(*[args[k] for k in ("q", "k", "v", "g", "beta", "state", "state_indices")], out=out, **kw)
        _finite(f"gated_delta_decode T{T} K{K} V{V} {'kda' if kda else 'gdn'}{' fused' if fused else ''} {layout} "
                f"padded rows 1,3", out)
        n += 1
    return n


def gated_delta_prefill_cases() -> int:
    from aotc.loader.ops.gated_delta_prefill import gated_delta_prefill
    from tests.cpu.kernels.gated_delta.chunk_cases import make_case

    n = 0
    # Chunks of 64 tokens: sequences of 1, 63, 65 (one past a chunk) and 64, the second padded.
    for K, V, kda, layout in ((128, 128, False, "vmajor"), (64, 64, True, "kmajor")):
        case = make_case([1, 63, 65, 64], H=2, HV=4, K=K, V=V, kda=kda, padded=(1,), state_layout=layout,
                         device=DEVICE, seed=n)
        out = torch.full_like(case["v"], float("nan"))
        gated_delta_prefill(*case.values(), state_layout=layout, out=out)
        _finite(f"gated_delta_prefill K{K} V{V} {'kda' if kda else 'gdn'} {layout} lengths [1, 63, 65, 64], "
                f"sequence 1 padded", out)
        n += 1
    return n


OPS = {"decode": decode_cases, "store_kv": store_kv_cases, "prefix_prefill": prefix_prefill_cases,
       "gated_delta_decode": gated_delta_cases, "gated_delta_prefill": gated_delta_prefill_cases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", choices=[*OPS, "all"], default="all")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run through Triton's interpreter "
                        "(TRITON_INTERPRET=1), to check the script itself")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    ops = OPS if args.op == "all" else {args.op: OPS[args.op]}
    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    if DEVICE == "cpu":
        from aotc.loader.interpreter import patch_interpreter

        patch_interpreter()
    total = sum(fn() for fn in ops.values())
    print(f"ok {total} cases", flush=True)


if __name__ == "__main__":
    main()
