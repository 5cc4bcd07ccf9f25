"""Variants of the prefix-prefill kernel: dtype x cache format x head_dim x cache layout.

Axes (all constexpr in the kernel; everything else is a runtime value):
  dtype     q/k/v and output dtype: fp16, bf16
  kv        cache format: "same" (the dtype), fp8_e4m3, fp8_e5m2 (one fp32 scale per K and V)
  head_dim  64, 80, 96, 128, 256 (80 and 96 run in a 128-wide tile, masked)
  layout    nhd [blocks, block_size, kv_heads, D] or vllm (K split in 16-byte groups, V transposed)
Window, sinks, fp8 output, skip_decode, block size and GQA group are runtime, so they cost no
binaries: 2 * 3 * 5 * 2 = 60 variants, each built at two specialization levels per arch.

Caches and output are byte pointers (see kernel.py): the signature names them u8.
"""
from __future__ import annotations

from aotc.kernels.variants import Arg, KernelSpec, LaunchConfig

DTYPES = ("fp16", "bf16")
KV_FORMATS = ("same", "fp8_e4m3", "fp8_e5m2")
HEAD_DIMS = (64, 80, 96, 128, 256)
LAYOUTS = ("nhd", "vllm")

_ptr = ("Q", "K", "V", "K_cache", "V_cache", "Out")
_meta = ("Block_table", "Query_start_loc", "Seq_lens")
_fp32_ptr = ("K_scale", "V_scale", "Out_scale", "Sinks")
_ints = ("batch", "num_queries_per_kv", "block_size", "stride_bt", "window", "has_sinks",
         "out_fp8", "skip_decode")
_strides = ("stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt", "stride_vh",
            "stride_ot", "stride_oh", "stride_kcb", "stride_kct", "stride_kch", "stride_kcd",
            "stride_vcb", "stride_vct", "stride_vch", "stride_vcd")

ARGS = (
    tuple(Arg(n, "ptr", aligned=True, dtype="dtype") for n in ("Q", "K", "V"))
    + tuple(Arg(n, "ptr", aligned=True, dtype="=u8") for n in ("K_cache", "V_cache", "Out"))
    + tuple(Arg(n, "ptr", dtype="=i32") for n in _meta)
    + tuple(Arg(n, "ptr", dtype="=fp32") for n in _fp32_ptr)
    + (Arg("sm_scale", "fp32"),)
    + tuple(Arg(n, "i32") for n in _ints)
    # Row strides of 16-byte vectors: every supported head_dim is a multiple of 16, so the
    # ALIGNED binary covers contiguous tensors and lets K/V tiles load as 16-byte vectors.
    + tuple(Arg(n, "i32", aligned=True) for n in _strides)
)

CONSTEXPRS = ("HEAD_DIM", "BLOCK_D", "BLOCK_M", "BLOCK_N", "KV_VLLM", "KV_X", "KV_FORMAT")


def block_d(head_dim: int) -> int:
    return 1 << (head_dim - 1).bit_length()


def tile(head_dim: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N). Arch-independent: the op's grid depends on BLOCK_M. BLOCK_N divides
    BLOCK_M (the kernel asserts it)."""
    if head_dim > 128:
        # H100 bf16 d256, b8 ctx2048+512: 259 TF/s vs 226 for 64x32 and 173 for 64x64. Q 64 KiB plus
        # two stages of 16 KiB K and V tiles: 128 KiB, inside sm80's 163 KiB.
        return 128, 32
    return 128, 64


def constexprs(axes) -> dict:
    hd = int(axes["head_dim"])
    bm, bn = tile(hd)
    fmt = KV_FORMATS.index(axes["kv"])
    return {
        "HEAD_DIM": hd, "BLOCK_D": block_d(hd), "BLOCK_M": bm, "BLOCK_N": bn,
        "KV_VLLM": int(axes["layout"] == "vllm"),
        "KV_X": 16 if fmt else 8,  # elements per 16 bytes: the vllm K layout's innermost group
        "KV_FORMAT": fmt,
    }


def variants():
    for dtype in DTYPES:
        for kv in KV_FORMATS:
            for hd in HEAD_DIMS:
                for layout in LAYOUTS:
                    yield {"dtype": dtype, "kv": kv, "head_dim": hd, "layout": layout}


def launch(axes, arch: int) -> LaunchConfig:
    hd = int(axes["head_dim"])
    # H100 bf16 d64: 4 warps 239 TF/s vs 8 warps 179 (b8 ctx2048+512), 274 vs 193 (b1 ctx16K+2K).
    warps = 4 if hd <= 64 else 8
    if arch >= 90 and hd <= 128 and axes["kv"] == "same" and axes["layout"] == "nhd":
        # H100 bf16 d128, page 16: 263 TF/s at 3 stages vs 260 at 2 (b8 ctx2048+512), 281 vs 268
        # (b1 ctx16K+2K). fp8 and vllm-layout caches convert or gather through registers: there
        # 2 stages win (223 vs 211, 177 vs 164 TF/s).
        return LaunchConfig(num_warps=warps, num_stages=3)
    return LaunchConfig(num_warps=warps, num_stages=2)


def axes_for(dtype: str, kv: str, head_dim: int, layout: str) -> dict:
    """The variant axes for a call (the op passes torch dtypes already mapped to names)."""
    return {"dtype": dtype, "kv": kv, "head_dim": head_dim, "layout": layout}


PREFIX_PREFILL = KernelSpec(
    name="prefix_prefill",
    module="aotc.kernels.prefix_prefill.kernel",
    function="prefix_prefill_kernel",
    args=ARGS,
    constexpr_names=CONSTEXPRS,
    constexprs=constexprs,
    variants=variants,
    launch=launch,
)

KERNELS = (PREFIX_PREFILL,)
