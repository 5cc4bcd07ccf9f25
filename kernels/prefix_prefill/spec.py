"""Variants of the prefix-prefill kernel: dtype x cache format x scales x head-dim bucket x layout.

Axes (constexpr in the kernel; everything else is a runtime value):
  dtype     q/k/v and output dtype: fp16, bf16
  kv        cache format: "same" (the dtype), fp8_e4m3, fp8_e5m2 (one fp32 scale per K and V),
            int8, int4 (decode's formats: codes * scale, int4 as code + 7 nibbles)
  scales    int8/int4: "token" (one scale a token and kv head: group == head_dim), "group" (one a
            token, kv head and group of 8..128 channels, the group size runtime: decode's and
            store_kv's per-group format) or "channel" ([kv_heads, D]: the Iluvatar layout's); int4
            also "token_zp" (vLLM's INT4_PER_TOKEN_HEAD codes, kernels/common/int4_rht.py: unsigned
            nibbles, one fp32 word a token and kv head holding the scale and, in its 4 low mantissa
            bits, the zero point; block_d 64 and 128; the op rotates q and the output); "none"
            for the other formats
  block_d   the tile width, a power of two: head_dim is runtime, masked to it (any multiple of 8
            in (block_d / 2, block_d], and 8..32 in 32); int4 starts at 64 (a 16-wide dot a part)
  layout    nhd [blocks, block_size, kv_heads, D] (any block/token/head strides: head-major too)
            or vllm (K split in groups of x, x runtime; V transposed, or vLLM's interleaved V with
            its pack factor runtime); int8/int4 nhd only
  score     float/fp8 caches: "plain", or "mod": softcap and ALiBi applied to the scores (their
            values runtime), and the masks beyond causal and window (chunked local attention,
            vLLM's bidirectional ranges; runtime too, they cost plain binaries ~5%). A runtime switch inside the tile loop cost shared memory (sm80's fp8
            vllm d128 binary 160 -> 232 KiB, over its 163) and would cost every call; int8/int4
            have "plain" only
  kv_align  int8 with per-token scales, nhd, block_d 64 and 128 only, absent from the other keys:
            4 where the cache rows are 4-byte aligned but not 16 (vLLM's INT8_PER_TOKEN_HEAD
            record [K codes | K scale | V codes | V scale]): the GENERIC binary reads 4 bytes a load.
            fp8_e4m3 with "token" scales (vLLM's FP8_PER_TOKEN_HEAD: one fp32 scale a token and kv
            head, the same record) exists at kv_align 4 only, nhd, block_d 64 and 128, plain
            scores: quant.py's int8 path on words of two e4m3 bytes (its ALIGNED binary serves
            16-byte rows)
Window, sinks, fp8 output, skip_decode, block size, GQA group, head_dim, vllm's x and the scales'
dtype (and the int group size), V's pack factor, kv_from_cache (new keys read from the
cache), chunked local attention and vLLM's bidirectional ranges are runtime, so they cost no
binaries: 2 * 3 * 4 * 2 * 2 = 96 float/fp8 variants plus 2 * 3 * (4 + 3) + 2 * 2 = 46 int8/int4
ones and 2 * 2 * 2 kv_align 4 ones (int8 and fp8_e4m3 per token), 150 in all, each built at two specialization levels per arch
(build times: BENCHMARKS.md, Kernel choices: prefix-prefill build).

Caches, scales and output are byte pointers (see kernel.py): the signature names them u8.

PREFIX_PREFILL_WS, the warp-specialized Gluon kernel (kernel_ws.py), serves on sm90 what it was
written for: int8/int4 (scales per token, channel or group) at block_d 128, fp16/bf16, nhd
(head-major caches too): 2 dtypes x 2 formats x 3 scales = 12 variants, ALIGNED only (12 keys
beside PREFIX_PREFILL's 180: 192 on sm90; sm80 and AMD unchanged). The op routes a call there
when `ws_serves` says so. PREFIX_PREFILL_WS_REC (kernel_ws_rec.py) serves the calls whose keys are
all in the cache (k = v = None, vLLM's unified_attention) on int8 / fp8_e4m3 per token (vLLM's
records) and fp8_e4m3 per cache: 6 variants, ALIGNED on q and out only (REC_ARGS), where
`rec_serves` says so.
"""
from __future__ import annotations

from aotc.kernels.common.formats import MAX_QUANT_GROUP, MIN_QUANT_GROUP  # noqa: F401 - the op's group bounds
from aotc.kernels.common.formats import ptx_constexprs
from aotc.kernels.variants import ALIGNED, Arg, KernelSpec, LaunchConfig, sm90_gluon_launch

DTYPES = ("fp16", "bf16")
KV_FORMATS = ("same", "fp8_e4m3", "fp8_e5m2", "int8", "int4")
INT_FORMATS = ("int8", "int4")
SCALES = ("none", "token", "channel", "group", "token_zp")
ZP_BLOCK_DS = (64, 128)  # "token_zp" (vLLM's INT4_PER_TOKEN_HEAD codes) at head sizes 64 and 128
BLOCK_DS = (32, 64, 128, 256)
MAX_HEAD_DIM = 256
LAYOUTS = ("nhd", "vllm")
SCORES = ("plain", "mod")
KV_ALIGN4_BLOCK_DS = (64, 128)  # vLLM's per-token-head head sizes (decode's PER_TOKEN_HEAD_DIMS)
KV_ALIGN4_FORMATS = ("int8", "fp8_e4m3")  # vLLM's INT8_PER_TOKEN_HEAD and FP8_PER_TOKEN_HEAD codes
FP8_TOKEN_FORMATS = ("fp8_e4m3",)  # fp8 with per-token scales: kv_align 4 variants only


def word_tiles(kv: str, scales: str = "none") -> bool:
    """Whether a cache runs quant.py's word tiles: int8/int4, and fp8 e4m3 with per-token scales."""
    return kv in INT_FORMATS or (kv in FP8_TOKEN_FORMATS and scales == "token")

_ptr = ("Q", "K", "V", "K_cache", "V_cache", "Out")
_meta = ("Block_table", "Query_start_loc", "Seq_lens")
_ints = ("batch", "num_queries_per_kv", "block_size", "stride_bt", "window", "has_sinks",
         "out_fp8", "skip_decode", "kv_xg", "scale_kind", "stride_ksb", "stride_kst", "stride_ksh")
_strides = ("head_dim", "stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt", "stride_vh",
            "stride_ot", "stride_oh", "stride_kcb", "stride_kct", "stride_kch", "stride_kcd",
            "stride_vcb", "stride_vct", "stride_vch", "stride_vcd")

ARGS = (
    tuple(Arg(n, "ptr", aligned=True, dtype="dtype") for n in ("Q", "K", "V"))
    + tuple(Arg(n, "ptr", aligned=True, dtype="=u8") for n in ("K_cache", "V_cache", "Out"))
    + tuple(Arg(n, "ptr", dtype="=i32") for n in _meta)
    + tuple(Arg(n, "ptr", dtype="=u8") for n in ("K_scale", "V_scale"))
    + tuple(Arg(n, "ptr", dtype="=fp32") for n in ("Out_scale", "Sinks"))
    + (Arg("sm_scale", "fp32"),)
    + tuple(Arg(n, "i32") for n in _ints)
    # head_dim and row strides: with head_dim % 16 == 0 (64, 80, 96, 128, 192, 256, ...) the
    # ALIGNED binary covers contiguous tensors and lets K/V tiles load as 16-byte vectors; other
    # multiples of 8 (24, 40, 72, 112, ...) run the GENERIC one.
    + tuple(Arg(n, "i32", aligned=True) for n in _strides)
)

# kernel.py's runtime score options after the shared arguments (kernel_ws.py takes ARGS only and
# serves none of them): ALiBi slopes [q_heads] fp32 with alibi_mode 0 off, 1 linear (slope * (key
# position - context length)), 2 vLLM's sqrt variant (-slope * sqrt(query - key position)); softcap
# (0: off) applied before ALiBi, as vLLM's unified attention does; kv_from_cache 1: the new tokens'
# keys and values are read from the cache too (k/v not read), the causal part ending at seq_len;
# Mm_ranges [batch, n_mm, 2] int32 (n_mm 0: none), vLLM's bidirectional ranges (kv_from_cache only),
# mm_clamp 1: within the window; chunk_size > 0: chunked local attention, chunk_lookback chunks back.
OPTION_ARGS = (Arg("Alibi_slopes", "ptr", dtype="=fp32"), Arg("softcap", "fp32"), Arg("alibi_mode", "i32"),
               Arg("kv_from_cache", "i32"), Arg("Mm_ranges", "ptr", dtype="=i32"), Arg("n_mm", "i32"),
               Arg("mm_clamp", "i32"), Arg("chunk_size", "i32"), Arg("chunk_lookback", "i32"))
KERNEL_ARGS = ARGS + OPTION_ARGS

CONSTEXPRS = ("BLOCK_D", "BLOCK_M", "BLOCK_N", "KV_VLLM", "KV_FORMAT", "SCALES", "PTX", "SCORE_MOD", "KV_ALIGN")
# The kernels' decorator switches, read off their arguments (the build's check_consistency holds
# them to it): ints that never specialize, and pointers whose alignment is never assumed.
DO_NOT_SPECIALIZE = [a.name for a in ARGS if a.kind == "i32" and not a.aligned]
DO_NOT_SPECIALIZE_ON_ALIGNMENT = [a.name for a in ARGS if a.kind == "ptr" and not a.aligned]
KERNEL_DO_NOT_SPECIALIZE = [a.name for a in KERNEL_ARGS if a.kind == "i32" and not a.aligned]
# kernel_ws_rec.py's arguments: ARGS with only q's and out's alignment assumed (the caches' rows
# are 4-byte aligned, checked by the op; k, v and their strides are not read)
REC_ALIGNED = ("Q", "Out", "head_dim", "stride_qt", "stride_qh", "stride_ot", "stride_oh")
REC_ARGS = tuple(Arg(a.name, a.kind, aligned=a.aligned and a.name in REC_ALIGNED, dtype=a.dtype) for a in ARGS)
REC_DO_NOT_SPECIALIZE = [a.name for a in REC_ARGS if a.kind == "i32" and not a.aligned]
REC_DO_NOT_SPECIALIZE_ON_ALIGNMENT = [a.name for a in REC_ARGS if a.kind == "ptr" and not a.aligned]
KERNEL_DO_NOT_SPECIALIZE_ON_ALIGNMENT = [a.name for a in KERNEL_ARGS if a.kind == "ptr" and not a.aligned]


def block_d(head_dim: int, kv: str = "same") -> int:
    """The tile width serving head_dim (a multiple of 8 up to 256)."""
    return max(32 if kv != "int4" else 64, 1 << (head_dim - 1).bit_length())


def tile(block_d: int, kv: str = "same", scales: str = "none") -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N). Arch-independent: the op's grid depends on BLOCK_M. BLOCK_N divides
    BLOCK_M (the kernel asserts it); target_constexprs narrows it on sm90 for fp16/bf16 d128."""
    if word_tiles(kv, scales) and block_d <= 128:
        # 4 warps x 32-key tiles beat 8 x 64 for int8 and int4, spills included (BENCHMARKS.md, Kernel choices: int tiles).
        return 128, 32
    if block_d > 128:
        # the fastest d256 tile (BENCHMARKS.md, Kernel choices: d256 tile); Q 64 KiB plus two stages of 16 KiB K and V
        # tiles: 128 KiB, inside sm80's 163 KiB.
        return 128, 32
    return 128, 64


def constexprs(axes) -> dict:
    bd = int(axes["block_d"])
    bm, bn = tile(bd, axes["kv"], axes["scales"])
    return {
        "BLOCK_D": bd, "BLOCK_M": bm, "BLOCK_N": bn,
        "KV_VLLM": int(axes["layout"] == "vllm"),
        "KV_FORMAT": KV_FORMATS.index(axes["kv"]),
        "SCALES": SCALES.index(axes["scales"]),
        "SCORE_MOD": SCORES.index(axes["score"]),
        "KV_ALIGN": int(axes.get("kv_align", 16)),
    }


def variants():
    for dtype in DTYPES:
        for kv in KV_FORMATS:
            for scales in (("token", "channel", "group") + (("token_zp",) if kv == "int4" else ())
                           if kv in INT_FORMATS else ("none",)):
                for bd in BLOCK_DS:
                    if (kv == "int4" and bd < 64) or (scales == "token_zp" and bd not in ZP_BLOCK_DS):
                        continue
                    for layout in (("nhd",) if kv in INT_FORMATS else LAYOUTS):
                        for score in (("plain",) if kv in INT_FORMATS else SCORES):
                            yield {"dtype": dtype, "kv": kv, "scales": scales, "block_d": bd, "layout": layout,
                                   "score": score}
    for kv in KV_ALIGN4_FORMATS:
        for dtype in DTYPES:
            for bd in KV_ALIGN4_BLOCK_DS:
                yield {"dtype": dtype, "kv": kv, "scales": "token", "block_d": bd, "layout": "nhd", "score": "plain",
                       "kv_align": 4}


def kv_align(axes, addresses) -> int:
    """4 for a call of a kv_align 4 variant's axes whose cache addresses and byte strides are all
    multiples of 4 but not all of 16 (16-byte rows take the ALIGNED binary), else 16. fp8 with
    per-token scales has kv_align 4 variants only: 4 whenever the addresses allow it (the op
    refuses the others)."""
    if not (axes["kv"] in KV_ALIGN4_FORMATS and axes["scales"] == "token" and axes["layout"] == "nhd"
            and axes["score"] == "plain" and int(axes["block_d"]) in KV_ALIGN4_BLOCK_DS):
        return 16
    if any(a % 4 for a in addresses) or (axes["kv"] == "int8" and not any(a % 16 for a in addresses)):
        return 16
    return 4


def _two_programs_an_sm(axes, arch) -> bool:
    """fp16/bf16 caches at block_d 128 (head dims 72..128), nhd, on sm90+: 128 x 32 tiles over 8
    warps capped at 128 registers (no spills in the loops; 80 KiB of shared memory at 3 stages), so
    two programs share an SM, against 128 x 64 at 230 registers, one an SM (BENCHMARKS.md, Kernel choices: two programs an
    SM). fp8 caches, the vllm layout, sm80 and AMD keep 128 x 64: not faster, or not measured."""
    return (getattr(arch, "backend", "cuda") == "cuda" and arch >= 90 and axes["kv"] == "same"
            and int(axes["block_d"]) == 128 and axes["layout"] == "nhd")


def target_constexprs(axes, arch) -> dict:
    """PTX (decode's: the packed dequantizers on CUDA), and BLOCK_N 32 where two programs share an
    SM (_two_programs_an_sm): the tile follows the target there, BLOCK_M does not (the op's grid)."""
    values = ptx_constexprs(axes, arch)
    if _two_programs_an_sm(axes, arch):
        values["BLOCK_N"] = 32
    return values


def launch(axes, arch: int) -> LaunchConfig:
    bd = int(axes["block_d"])
    if _two_programs_an_sm(axes, arch):
        return LaunchConfig(num_warps=8, num_stages=3, maxnreg=128)
    # d64: 4 warps beat 8 (BENCHMARKS.md, Kernel choices: warps and stages).
    warps = 4 if bd <= 64 or (word_tiles(axes["kv"], axes["scales"]) and bd <= 128) else 8  # int8/int4: see tile()
    if (arch >= 90 and bd <= 128 and axes["kv"] in ("same", "fp8_e4m3", "fp8_e5m2") and axes["layout"] == "nhd"
            and not word_tiles(axes["kv"], axes["scales"])):
        # 3 stages for fp16/bf16 d32/d64 and fp8 (its context rows loaded a tile ahead); vllm-layout
        # and int8/int4 caches go through registers: 2 stages (BENCHMARKS.md, Kernel choices: warps and stages).
        return LaunchConfig(num_warps=warps, num_stages=3)
    return LaunchConfig(num_warps=warps, num_stages=2)


def axes_for(dtype: str, kv: str, scales: str, head_dim: int, layout: str, score: str = "plain") -> dict:
    """The variant axes for a call (the op passes torch dtypes already mapped to names)."""
    return {"dtype": dtype, "kv": kv, "scales": scales, "block_d": block_d(head_dim, kv), "layout": layout,
            "score": score}


def ws_axes(axes) -> dict:
    """kernel_ws.py's (and kernel_ws_rec.py's) axes for a call's axes: no "score" (they serve
    "plain" calls only), no "kv_align" (kernel_ws_rec.py reads any 4-byte-aligned rows)."""
    return {k: v for k, v in axes.items() if k not in ("score", "kv_align")}


PREFIX_PREFILL = KernelSpec(
    name="prefix_prefill",
    module="aotc.kernels.prefix_prefill.kernel",
    function="prefix_prefill_kernel",
    args=KERNEL_ARGS,
    constexpr_names=CONSTEXPRS,
    constexprs=constexprs,
    variants=variants,
    launch=launch,
    target_constexprs=target_constexprs,
)


def ws_variant(axes) -> bool:
    """The axes kernel_ws.py implements: int8/int4 with any of their scales (per token, group or
    channel), 128-wide tiles (head dims 72..128; ws_serves keeps the multiples of 16), nhd-family
    caches, plain scores."""
    return (axes["kv"] in INT_FORMATS and int(axes["block_d"]) == 128 and axes["layout"] == "nhd"
            and axes.get("score", "plain") == "plain" and axes["scales"] != "token_zp" and "kv_align" not in axes)


def ws_serves(axes, capability: tuple[int, int], out_fp8: bool, aligned: bool) -> bool:
    """Whether a call runs kernel_ws.py: one of its variants on an sm90 GPU (capability 9.0: wgmma and
    setmaxnreg; not sm100's tensor cores), bf16/fp16 output, and arguments that meet the ALIGNED
    specialization (its only binary: cp.async copies 16 bytes). Everything else runs kernel.py."""
    return ws_variant(axes) and tuple(capability) == (9, 0) and not out_fp8 and aligned


def ws_constexprs(axes) -> dict:
    bd = int(axes["block_d"])
    return {"BLOCK_D": bd, "BLOCK_M": tile(bd, axes["kv"])[0], "BLOCK_N": 128,
            "KV_FORMAT": KV_FORMATS.index(axes["kv"]), "SCALES": SCALES.index(axes["scales"])}


def ws_variants():
    for dtype in DTYPES:
        for kv in INT_FORMATS:
            for scales in ("token", "channel", "group"):
                yield {"dtype": dtype, "kv": kv, "scales": scales, "block_d": 128, "layout": "nhd"}


ws_launch = sm90_gluon_launch(ws_variant)  # 16 warps: two consumers and an 8-warp producer


PREFIX_PREFILL_WS = KernelSpec(
    name="prefix_prefill_ws",
    module="aotc.kernels.prefix_prefill.kernel_ws",
    function="prefix_prefill_ws_kernel",
    args=ARGS,
    constexpr_names=("BLOCK_D", "BLOCK_M", "BLOCK_N", "KV_FORMAT", "SCALES"),
    constexprs=ws_constexprs,
    variants=ws_variants,
    launch=ws_launch,
    sources=("kernel_ws.py",),
    levels=(ALIGNED,),
    kind="gluon",
)

# PREFIX_PREFILL_WS_REC, kernel_ws_rec.py: the same program for calls whose new tokens' keys are in
# the cache (vLLM's unified_attention): int8 and fp8 e4m3 per token (vLLM's per-token-head records)
# and fp8 e4m3 per cache, at block_d 128, fp16/bf16: 6 variants, ALIGNED only (REC_ARGS: q and out).
REC_FORMATS = (("int8", "token"), ("fp8_e4m3", "token"), ("fp8_e4m3", "none"))


def rec_variant(axes) -> bool:
    """The axes kernel_ws_rec.py implements (the call's kv_align aside)."""
    return ((axes["kv"], axes["scales"]) in REC_FORMATS and int(axes["block_d"]) == 128 and axes["layout"] == "nhd"
            and axes.get("score", "plain") == "plain")


def rec_serves(axes, capability: tuple[int, int], out_fp8: bool, aligned: bool, from_cache: bool,
               rows: bool) -> bool:
    """Whether a call runs kernel_ws_rec.py: one of its variants on an sm90 GPU, every key read from
    the cache (from_cache), fp16/bf16 output, q and out meeting its ALIGNED binary's assumptions
    (aligned), and cache addresses and byte strides fit its loads (rows: 8 bytes of K and 4 of V on
    vLLM's records, 16 per cache)."""
    return (rec_variant(axes) and tuple(capability) == (9, 0) and from_cache and not out_fp8 and aligned
            and rows)


def rec_variants():
    for dtype in DTYPES:
        for kv, scales in REC_FORMATS:
            yield {"dtype": dtype, "kv": kv, "scales": scales, "block_d": 128, "layout": "nhd"}


PREFIX_PREFILL_WS_REC = KernelSpec(
    name="prefix_prefill_ws_rec",
    module="aotc.kernels.prefix_prefill.kernel_ws_rec",
    function="prefix_prefill_ws_rec_kernel",
    args=REC_ARGS,
    constexpr_names=("BLOCK_D", "BLOCK_M", "BLOCK_N", "KV_FORMAT", "SCALES"),
    constexprs=ws_constexprs,
    variants=rec_variants,
    launch=sm90_gluon_launch(rec_variant),  # 16 warps: two consumers and an 8-warp producer
    sources=("kernel_ws_rec.py", "kernel_ws.py"),
    levels=(ALIGNED,),
    kind="gluon",
)

KERNELS = (PREFIX_PREFILL, PREFIX_PREFILL_WS, PREFIX_PREFILL_WS_REC)
