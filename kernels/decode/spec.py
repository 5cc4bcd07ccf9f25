"""Variant table and launch geometry of the flash-decoding family (`kernel.py`).

Split kernel axes: `q` (fp16, bf16), `kv` (the cache format: the query's own dtype, int8, int4,
fp8_e4m3, fp8_e5m2), `scale` (fp16, bf16, fp32 for int8/int4; fp32 otherwise: fp8's per-head
scale, or an unused placeholder for fp16/bf16 caches), `head_dim` (64, 96, 128, 256), `scales`
(int8/int4: "token" for one scale a token, group == head_dim, and "chunk" for int8 groups of 64
at head_dim 128, which share a loop in the kernel that scales exact code dots; "group" for the
other groups of 32 channels and more at head dims 128 and 256, "small_group" for
the other groups (8-16, and 32 at head dims 64 and 96), which read their scales differently
(kernel._scales); "channel" for int8 with one fp32 scale a KV head and channel, [kv_heads, D]
(the Iluvatar library's layout: exact code dots, K's scales folded into the query, V's into the
output; fp32 scales only, 8 variants); "none" for other formats), `tile` (the program's launch
geometry: "wide", 4 warps over 128-token tiles, or "narrow", 2 warps over 64-token tiles, which
int4 takes at head_dim 64 and, with one scale a token at head_dim 128, when the call's grid can
fill the GPU with it; see `split_tiles`), plus `cache`,
the element type the kernel reads the cache as, which follows from `kv` (fp8 is read as raw int8
bytes, see kernel.py) and multiplies nothing. Merge kernel axes: `out` (fp16, bf16), `head_dim`,
`splits` (the tile of partial results it reads at once: 4, 16 or 64, the smallest that holds the
call's split count).
Everything else (page size, window, group size, lengths) is a runtime argument; page and
quantization group sizes are powers of two, passed as their log2.
"""
from __future__ import annotations

from ..common.formats import MAX_QUANT_GROUP, MIN_QUANT_GROUP, ptx_constexprs  # noqa: F401 - the op's bounds
from ..variants import Arg, KernelSpec, LaunchConfig

Q_DTYPES = ("fp16", "bf16")
KV_FORMATS = ("fp16", "bf16", "int8", "int4", "fp8_e4m3", "fp8_e5m2")
INT_FORMATS = ("int8", "int4")
SCALE_DTYPES = ("fp16", "bf16", "fp32")
HEAD_DIMS = (64, 96, 128, 256)
PER_TOKEN_HEAD_DIMS = (64, 128)  # a group of head_dim channels: a power of two <= MAX_QUANT_GROUP
MAX_SMALL_GROUP = 32  # groups up to this many channels may read each token's scales as one row
GROUP_RUN = 32  # at WIDE_GROUP_HEAD_DIMS, groups of at least this many read one scale a run of 32 in place
# int8 groups of 64+ channels that are not one a token, at CHUNK_HEAD_DIMS ("chunk"): each
# 64-channel chunk's scores are an exact dot over codes, scaled after the dot (kernel._attend_chunked,
# CHUNK_WORDS). H100, split kernel, group 64 at head_dim 128, % of copy, "group" (s3, maxnreg 168)
# -> "chunk" (s3, no cap): batch 32 x 4K 81.0 -> 81.7, 64 x 4K 83.4 -> 84.3, 32 x 8K 86.3 -> 87.3,
# 1 x 32K 60.2 -> 64.1; and the scale no longer rounds each dequantized element to fp16 (rel. error
# against the chunk path 9e-4). At head_dim 256 (group 128) "group" at its best config stayed
# ahead (88.1 against 86.1), and int4 (chunks of 128 channels: head_dim 256) lost (66.5 -> 63.8).
CHUNK_CHANNELS = 64
CHUNK_HEAD_DIMS = (128,)
WIDE_GROUP_HEAD_DIMS = (128, 256)  # head dims with a "group" variant (groups of 32+ that are not one a token)

KV_KIND = {"fp16": 0, "bf16": 0, "int8": 1, "int4": 2, "fp8_e4m3": 3, "fp8_e5m2": 4}
CACHE_DTYPE = {"fp16": "fp16", "bf16": "bf16", "int8": "int8", "int4": "int4",
               "fp8_e4m3": "int8", "fp8_e5m2": "int8"}

BLOCK_H = 16  # query heads of one KV group per program: the M of the QK^T tensor-core dot
MAX_SPLITS = 64  # bounds the workspace; the merge kernel reads all splits in one tile
MAX_BATCH = 65535  # the split grid's second dimension (CUDA's limit)
PROGRAMS_PER_SM = 4  # splits are added until the grid fills this many programs per SM


def block_d(head_dim: int) -> int:
    return 1 << (head_dim - 1).bit_length()


def block_n(head_dim: int, tile: str = "wide") -> int:
    """Tokens a tile. On an H100 (32/8 heads, head_dim 128, 4 warps, 2 stages), 128 was the best or
    within 5% of it at batch 1 x 32K, 8 x 8K, 32 x 16K and 128 x 2K for every format: bf16
    59/102/723/387 us (64: 56/109/756/384, 32: 56/101/721/487), int8 batch 8 x 8K 116 us (64: 139),
    int4 84 us (64: 108). At head_dim 256 the tile halves to keep registers. The narrow tile
    (2 warps, `split_launch`) takes 64."""
    return 64 if tile == "narrow" or head_dim > 128 else 128


# int4's "narrow" tile: 2 warps, 64-token tiles, 3 stages (`split_launch`). bench/sweep_decode.py,
# H100, split kernel, 32/8 heads, page 16, % of copy bandwidth, wide (4 warps, 128 tokens, 2
# stages) -> narrow, each at the split count the op picks for its occupancy:
#   head_dim 128, one scale a token: batch 32 x 4K 62.2 -> 67.9, 64 x 4K 65.6 -> 71.6, 32 x 8K
#   68.4 -> 73.0; page 1 58.6 -> 66.0; 64/8 heads 60.9 -> 66.2; 32/32 heads 66.7 -> 71.9; batch 16
#   x 8K 62.4 -> 67.1, 8 x 8K 54.9 -> 58.2, 4 x 16K 54.4 -> 57.6; but batch 1 x 32K 42.9 -> 36.4
#   (8 programs a split, at most MAX_SPLITS splits: too few to fill the GPU with 2-warp programs).
#   head_dim 64: one scale a token batch 32 x 4K 19.8 -> 39.0, batch 1 x 32K 16.1 -> 24.4; groups
#   of 32 channels 16.5 -> 26.4 (28.5 at 6 splits), 14.0 -> 22.7.
#   int4 per-group at head_dim 128 and int8 gained nothing (int8 per-token 86.6 -> 81.7 at best).
# So narrow is the only tile of int4 at head_dim 64, and one of two for int4 one scale a token at
# head_dim 128, taken when the grid at MAX_SPLITS splits holds NARROW_PROGRAMS_PER_SM programs an
# SM (that binary's occupancy on an H100: 6); the choice depends on batch and heads, never on
# lengths, so a captured graph keeps its binary.
NARROW_PROGRAMS_PER_SM = 6


def split_tiles(kv: str, head_dim: int, scales: str) -> tuple[str, ...]:
    """The tiles declared for a variant, preferred first when the grid is large enough."""
    if kv == "int4" and head_dim == 64:
        return ("narrow",)
    if kv == "int4" and head_dim == 128 and scales == "token":
        return ("narrow", "wide")
    return ("wide",)


def choose_tile(tiles: tuple[str, ...], base_programs: int, sm_count: int) -> str:
    """Of a variant's tiles, the narrow one when `base_programs` (batch x KV heads x head blocks) at
    MAX_SPLITS splits gives every SM NARROW_PROGRAMS_PER_SM programs; else the wide one."""
    if len(tiles) == 1:
        return tiles[0]
    return "narrow" if base_programs * MAX_SPLITS >= NARROW_PROGRAMS_PER_SM * sm_count else "wide"


def split_axes(q: str, kv: str, scale: str, head_dim: int, per_token: bool = False, quant_group: int = 0,
               tile: str | None = None, channel: bool = False) -> dict:
    """The split kernel's axes for a call; ValueError if no variant can serve it. per_token: an
    int8/int4 cache with one scale a token (quantization group == head_dim); else quant_group, the
    channels a scale covers (int8/int4), picks "chunk" (int8, >= CHUNK_CHANNELS at CHUNK_HEAD_DIMS),
    "group" (>= GROUP_RUN at WIDE_GROUP_HEAD_DIMS) or "small_group" (<= MAX_SMALL_GROUP).
    tile: one of `split_tiles` (None: the first, which the op replaces with `choose_tile`'s).
    channel: an int8 cache with fp32 scales [kv_heads, head_dim] ("channel")."""
    if q not in Q_DTYPES:
        raise ValueError(f"query dtype must be one of {Q_DTYPES}, got {q}")
    if kv not in KV_FORMATS:
        raise ValueError(f"kv_format must be one of {KV_FORMATS}, got {kv}")
    if kv in ("fp16", "bf16") and kv != q:
        raise ValueError(f"an {kv} cache needs an {kv} query, got {q}")
    if kv in INT_FORMATS:
        if scale not in SCALE_DTYPES:
            raise ValueError(f"{kv} scales must be one of {SCALE_DTYPES}, got {scale}")
    elif scale != "fp32":
        raise ValueError(f"a {kv} cache takes fp32 scales (placeholder for fp16/bf16), got {scale}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}")
    if per_token and (kv not in INT_FORMATS or head_dim not in PER_TOKEN_HEAD_DIMS):
        raise ValueError(f"one scale a token is for int8/int4 caches of head_dim {PER_TOKEN_HEAD_DIMS}, not "
                         f"{kv} at head_dim {head_dim}")
    if channel and (kv != "int8" or scale != "fp32" or per_token or quant_group):
        raise ValueError(f"per-channel scales are for int8 caches with fp32 scales, not {kv} with {scale} scales")
    if kv not in INT_FORMATS:
        scales = "none"
    elif channel:
        scales = "channel"
    elif per_token:
        scales = "token"
    elif kv == "int8" and head_dim in CHUNK_HEAD_DIMS and quant_group >= CHUNK_CHANNELS:
        scales = "chunk"
    elif head_dim in WIDE_GROUP_HEAD_DIMS and quant_group >= GROUP_RUN:
        scales = "group"
    elif quant_group and quant_group <= MAX_SMALL_GROUP:
        scales = "small_group"
    else:
        raise ValueError(f"groups of more than {MAX_SMALL_GROUP} channels that are not one a token are for head "
                         f"dims {WIDE_GROUP_HEAD_DIMS}, not {head_dim}")
    tiles = split_tiles(kv, head_dim, scales)
    if tile is None:
        tile = tiles[0]
    elif tile not in tiles:
        raise ValueError(f"tile {tile!r}: a {kv} cache at head_dim {head_dim} with {scales} scales has tiles {tiles}")
    return {"q": q, "kv": kv, "scale": scale, "head_dim": head_dim, "cache": CACHE_DTYPE[kv], "scales": scales,
            "tile": tile}


MERGE_SPLIT_TILES = (4, 16, MAX_SPLITS)


def merge_split_tile(splits: int) -> int:
    """The smallest merge tile that holds `splits` partial results. One [MAX_SPLITS, BLOCK_D] tile
    for every call made the merge a wave of register-heavy programs: 7-12 us at batch 32-64 with 3
    splits on an H100, next to a 75-200 us split kernel (bench/l2_state.py)."""
    if not 1 <= splits <= MAX_SPLITS:
        raise ValueError(f"splits must be in 1..{MAX_SPLITS}, got {splits}")
    return next(t for t in MERGE_SPLIT_TILES if splits <= t)


def merge_axes(out: str, head_dim: int, splits: int) -> dict:
    if out not in Q_DTYPES:
        raise ValueError(f"output dtype must be one of {Q_DTYPES}, got {out}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}")
    return {"out": out, "head_dim": head_dim, "splits": merge_split_tile(splits)}


def head_blocks(group: int) -> int:
    return -(-group // BLOCK_H)


def num_splits(batch: int, kv_heads: int, group: int, sm_count: int, programs_per_sm: int | None = None) -> int:
    """Splits of each sequence: enough programs to fill every SM, never past MAX_SPLITS.

    Depends on no length, so a captured CUDA graph replays at any length. The base count gives
    PROGRAMS_PER_SM programs an SM: batch 1 with 8 KV heads on a 132-SM H100 gets 64 splits (512
    programs), batch 32 gets 3. Given the variant's real occupancy (`programs_per_sm`, from the
    binary), the count moves to the nearest one whose programs fill their last wave to >= 95%
    (none within MAX_SPLITS, or four waves and more already: the base count). H100, split kernel,
    int8/int4 per-token at 3 programs an SM: batch 1 x 32K 64 -> 49 splits, int8 50.4 -> 55.2% of
    copy, int4 33.0 -> 37.5%; batch 64 x 4K 2 -> 3, int8 83.7 -> 85.4%, int4 59.7 -> 62.9%; bf16 at
    2 an SM keeps its counts.
    """
    base = max(1, batch * kv_heads * head_blocks(group))
    splits = max(1, min(MAX_SPLITS, -(-PROGRAMS_PER_SM * sm_count // base)))
    slots = (programs_per_sm or 0) * sm_count
    if not slots or base * splits >= 4 * slots:  # unknown, or four waves and more: little to gain
        return splits

    def filled(s: int) -> bool:
        programs = base * s
        return programs >= 0.95 * slots * -(-programs // slots)

    for step in range(MAX_SPLITS):
        for s in (splits - step, splits + step):
            if 1 <= s <= MAX_SPLITS and filled(s):
                return s
    return splits


def split_grid(batch: int, kv_heads: int, group: int, splits: int) -> tuple[int, int, int]:
    """KV head (block) fastest: programs that run together read the same pages, each head's slice
    of a token being only head_dim or head_dim / 2 bytes (H100, batch 32 x 4K: int8 per-token 77.3
    -> 79.3%, int4 55.5 -> 58.0% of copy bandwidth; bf16 unchanged)."""
    return (kv_heads * head_blocks(group), batch, splits)


def merge_grid(batch: int, q_heads: int) -> tuple[int, int, int]:
    return (batch, q_heads, 1)


def workspace_elements(batch: int, q_heads: int, splits: int, head_dim: int) -> tuple[int, int]:
    """fp32 elements of the partial outputs and of the log-sum-exps."""
    return batch * q_heads * splits * head_dim, batch * q_heads * splits


# --- split kernel ---------------------------------------------------------------------------

_I32 = "i32"
SPLIT_ARGS = (
    Arg("Q", "ptr", aligned=True, dtype="q"),
    Arg("K", "ptr", aligned=True, dtype="cache"),
    Arg("V", "ptr", aligned=True, dtype="cache"),
    Arg("KS", "ptr", dtype="scale"),
    Arg("VS", "ptr", dtype="scale"),
    Arg("Table", "ptr", dtype="=i32"),
    Arg("ReqIdx", "ptr", dtype="=i32"),
    Arg("SeqLens", "ptr", dtype="=i32"),
    Arg("PartO", "ptr", aligned=True, dtype="=fp32"),
    Arg("PartLse", "ptr", aligned=True, dtype="=fp32"),
    Arg("sm_scale", "fp32"),
    *(Arg(n, _I32) for n in ("window", "use_req_idx", "page_shift", "max_pages", "stride_table",
                             "q_heads", "group", "quant_shift")),
    *(Arg(n, _I32, aligned=True) for n in ("stride_qb", "stride_qh", "stride_kp", "stride_kt",
                                           "stride_kh", "stride_vp", "stride_vt", "stride_vh")),
    *(Arg(n, _I32) for n in ("stride_ksp", "stride_kst", "stride_ksh",
                             "stride_vsp", "stride_vst", "stride_vsh")),
)


def split_constexprs(axes) -> dict:
    hd = int(axes["head_dim"])
    return {"HEAD_DIM": hd, "BLOCK_D": block_d(hd), "BLOCK_N": block_n(hd, str(axes["tile"])), "BLOCK_H": BLOCK_H,
            "KV_KIND": KV_KIND[str(axes["kv"])], "PER_TOKEN": int(axes["scales"] == "token"),
            "ROW_SCALES": int(axes["scales"] == "small_group"), "CHUNK_SCALES": int(axes["scales"] == "chunk"),
            "CHANNEL_SCALES": int(axes["scales"] == "channel")}


def split_variants():
    for q in Q_DTYPES:
        for kv in (q, "int8", "int4", "fp8_e4m3", "fp8_e5m2"):
            for scale in SCALE_DTYPES if kv in INT_FORMATS else ("fp32",):
                for hd in HEAD_DIMS:
                    if kv not in INT_FORMATS:
                        calls = [{}]
                    else:
                        calls = [{"quant_group": MIN_QUANT_GROUP}]
                        if hd in WIDE_GROUP_HEAD_DIMS:
                            calls.append({"quant_group": 64})  # int8 at CHUNK_HEAD_DIMS: "chunk"
                            if kv == "int8" and hd in CHUNK_HEAD_DIMS:
                                calls.append({"quant_group": GROUP_RUN})  # there "group" serves groups of 32
                        if hd in PER_TOKEN_HEAD_DIMS:
                            calls.append({"per_token": True})
                        if kv == "int8" and scale == "fp32":
                            calls.append({"channel": True})
                    for call in calls:
                        axes = split_axes(q, kv, scale, hd, **call)
                        for tile in split_tiles(kv, hd, axes["scales"]):
                            yield dict(axes, tile=tile)


def split_launch(axes, arch: int) -> LaunchConfig:
    # bench/sweep_decode.py on an H100 (BLOCK_N 64/128 x 4/8 warps x 2/3 stages, batch 32 x 4K and
    # 1 x 32K): 4 warps led every format. 3 stages (two tile buffers) helped int8 only (45.0 -> 48.0%
    # and 36.4 -> 37.5% of copy bandwidth); bf16 was within 1% and int4 slower.
    # int8/int4 with per-group scales: ptxas gives them 177-243 registers, two programs an SM;
    # capped at 168 it fits three (H100, batch 32 x 4K, BLOCK_D 128: int8 group 64 64.4 -> 69.1%,
    # int4 group 64 38.9 -> 44.2% of copy; the cap cost bf16 91 -> 80% and gave per-token nothing).
    pdl = arch >= 90  # a programmatic dependent launch on sm90+ (kernel.py: the PDL constexpr)
    if axes["tile"] == "narrow":  # 2 warps, 64-token tiles, 3 stages (see NARROW_PROGRAMS_PER_SM)
        return LaunchConfig(num_warps=2, num_stages=3, launch_pdl=pdl)
    grouped = axes["scales"] in ("group", "small_group")
    cap = 168 if grouped and int(axes["head_dim"]) <= 128 else 0
    # int8 per-token: 2 stages keep it at 168 registers, three programs an SM (3 stages: 183, two;
    # batch 32 x 4K 77.3 vs 73.1%). int4 per-group: 3 stages with its table load hidden from the
    # pipeliner (kernel._pages_nc).
    # "channel" takes int8 per-token's config (its loop, minus the scale loads): not measured yet.
    stages = 3 if grouped or axes["scales"] == "chunk" else 2  # chunk: 146 registers, no cap (CHUNK_CHANNELS)
    if grouped and int(axes["head_dim"]) > 128:
        # Head dim 256 (64-token tiles), split kernel, % of copy at batch 32 x 4K / 64 x 4K / 1 x 32K
        # (bench/results/2026-11-23-h100-session9-d256-sweep.jsonl), 3 stages uncapped before:
        # int4 "group": capped at 168 +0.9 to +1.9 in every cell (group 64 64.2 -> 65.3, 66.9 ->
        # 68.3, 52.0 -> 53.4); "small_group" (group 8), 2 stages: int8 66.6 -> 68.2, 68.0 -> 70.9,
        # 59.8 -> 61.3, int4 54.1 -> 54.9, 56.0 -> 56.8, 46.4 -> 47.2.
        # int8 "group": 2 stages capped at 168 (three programs an SM instead of two), each binary
        # at the split count the op derives from its occupancy (num_splits), group 128 / 64:
        # batch 32 x 4K 79.3 -> 87.9 / 78.2 -> 85.6, 64 x 4K 82.7 -> 90.3 / 81.1 -> 88.6, 16 x 8K
        # 80.5 -> 87.2 / 78.7 -> 85.0, 8 x 8K 75.2 -> 82.3 / 73.5 -> 80.2, 4 x 16K 76.4 -> 82.1 /
        # 73.4 -> 80.0, 1 x 32K 67.4 -> 72.9 / 64.8 -> 70.4 (...-session10-d256-sweep.jsonl).
        # (Timed at the uncapped binary's split counts, the cap had looked like a loss below batch
        # 32: 1 x 32K at 64 splits fills 1.3 waves of three programs an SM.)
        if axes["scales"] == "small_group":
            stages = 2
        elif axes["kv"] == "int4":
            cap = 168
        else:
            stages, cap = 2, 168
    return LaunchConfig(num_warps=4, num_stages=stages, maxnreg=cap, launch_pdl=pdl)


SPLIT = KernelSpec(
    name="decode_split",
    module="aotc.kernels.decode.kernel",
    sources=("kernel.py",),
    function="decode_split_kernel",
    args=SPLIT_ARGS,
    constexpr_names=("HEAD_DIM", "BLOCK_D", "BLOCK_N", "BLOCK_H", "KV_KIND", "PER_TOKEN", "ROW_SCALES", "CHUNK_SCALES",
                     "CHANNEL_SCALES", "PDL", "PTX"),
    constexprs=split_constexprs,
    variants=split_variants,
    launch=split_launch,
    target_constexprs=ptx_constexprs,
)

# --- merge kernel ---------------------------------------------------------------------------

MERGE_ARGS = (
    Arg("PartO", "ptr", aligned=True, dtype="=fp32"),
    Arg("PartLse", "ptr", aligned=True, dtype="=fp32"),
    Arg("Sinks", "ptr", dtype="=fp32"),
    Arg("Out", "ptr", aligned=True, dtype="out"),
    Arg("Lse", "ptr", dtype="=fp32"),  # [batch, q_heads] natural-log LSE when write_lse (a runtime flag)
    Arg("use_sinks", "i32"),
    Arg("write_lse", "i32"),
    Arg("q_heads", "i32"),
    Arg("num_splits", "i32"),
    Arg("stride_ob", "i32", aligned=True),
    Arg("stride_oh", "i32", aligned=True),
    Arg("stride_lse", "i32"),
)


def merge_constexprs(axes) -> dict:
    hd = int(axes["head_dim"])
    return {"HEAD_DIM": hd, "BLOCK_D": block_d(hd), "BLOCK_S": int(axes["splits"])}


def merge_variants():
    for out in Q_DTYPES:
        for hd in HEAD_DIMS:
            for tile in MERGE_SPLIT_TILES:
                yield merge_axes(out, hd, tile)


def merge_launch(axes, arch: int) -> LaunchConfig:
    # The [BLOCK_S, BLOCK_D] fp32 tile at <= 64 elements a thread (64 x 128 at 4 warps). sm90+:
    # a programmatic dependent launch (the kernel's PDL constexpr follows it).
    elements = int(axes["splits"]) * block_d(int(axes["head_dim"]))
    return LaunchConfig(num_warps=max(1, min(8, elements // (64 * 32))), num_stages=1, launch_pdl=arch >= 90)


MERGE = KernelSpec(
    name="decode_merge",
    module="aotc.kernels.decode.kernel",
    sources=("kernel.py",),
    function="decode_merge_kernel",
    args=MERGE_ARGS,
    constexpr_names=("HEAD_DIM", "BLOCK_D", "BLOCK_S", "PDL"),
    constexprs=merge_constexprs,
    variants=merge_variants,
    launch=merge_launch,
)

KERNELS = (SPLIT, MERGE)
