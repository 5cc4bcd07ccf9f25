"""Variant table and launch geometry of the flash-decoding family (`kernel.py`).

Split kernel axes: `q` (fp16, bf16), `kv` (the cache format: the query's own dtype, int8, int4,
fp8_e4m3, fp8_e5m2, and int4_zp: vLLM's INT4_PER_TOKEN_HEAD codes, "token" scales in fp32 words
holding the zero point, head dims 64 and 128, see ZP_FORMATS; int4_rht: the same codes with the
rotation they were stored under undone in the kernel), `scale` (fp16, bf16, fp32 for
int8/int4; fp32 otherwise: fp8's per-head scale, or an unused placeholder for fp16/bf16 caches),
`head_dim` (64, 96, 128, 256), `scales` (int8/int4: "token" for one scale a token, group ==
head_dim, and "chunk" for int8 groups of 64 at head_dim 128, which share a loop in the kernel that
scales exact code dots; "group" for the other groups of 32 channels and more at head dims 128 and
256, "small_group" for the other groups (8-16, and 32 at head dims 64 and 96), which read their
scales differently (kernel._scales); "channel" for int8 with one fp32 scale a KV head and channel,
[kv_heads, D] (the Iluvatar library's layout: exact code dots, K's scales folded into the query, V's
into the output; fp32 scales only, 8 variants); "none" for other formats), `tile` (the program's
launch geometry: "wide", 4 warps over 128-token tiles, or "narrow", 2 warps over 64-token tiles,
which int4 takes at head_dim 64 and, with one scale a token at head_dim 128, when the call's grid
can fill the GPU with it; see `split_tiles`), `score` and `kv_align` (vLLM's variants only, absent
from the others' keys: "mod" applies softcap and ALiBi to the scores, their values runtime; kv_align
4 marks per-token caches whose rows start 4-byte aligned only, vLLM's inline-scale layout, whose K
and V tiles are then read as 4-byte vectors at either specialization level; see `vllm_variants`),
plus `cache`, the element type the kernel reads the cache as, which follows from `kv` (fp8 is read
as raw int8 bytes, see kernel.py) and multiplies nothing. Merge kernel axes: `out` (fp16, bf16),
`head_dim`, `splits` (4, 16, 64 or 256: the one tile of partial results it reads at once, the
smallest that holds the call's split count, 64 and 256 over channel blocks of MERGE_NARROW_D; MAX_SPLITS: a
loop over tiles of MERGE_LOOP_SPLITS, each program merging MERGE_LOOP_D channels).
Everything else (page size, window, group size, lengths) is a runtime argument; page and
quantization group sizes are powers of two, passed as their log2.
"""
from __future__ import annotations

from ..common.formats import MAX_QUANT_GROUP, MIN_QUANT_GROUP, ptx_constexprs  # noqa: F401 - the op's bounds
from ..variants import Arg, KernelSpec, LaunchConfig

Q_DTYPES = ("fp16", "bf16")
KV_FORMATS = ("fp16", "bf16", "int8", "int4", "fp8_e4m3", "fp8_e5m2", "int4_zp", "int4_rht")
INT_FORMATS = ("int8", "int4")
# vLLM's INT4_PER_TOKEN_HEAD codes (kernels/common/int4_rht.py): unsigned nibbles, one fp32 scale
# word a token and KV head holding the zero point in its 4 low mantissa bits. "int4_zp" reads the
# stored (rotated) values as they are; "int4_rht" rotates q and each split's partial output in the
# split kernel (its RHT constexpr; the signs: loader/ops/decode_rht.signs).
ZP_FORMATS = ("int4_zp", "int4_rht")
SCALE_DTYPES = ("fp16", "bf16", "fp32")
HEAD_DIMS = (64, 96, 128, 256)
PER_TOKEN_HEAD_DIMS = (64, 128)  # a group of head_dim channels: a power of two <= MAX_QUANT_GROUP
MAX_SMALL_GROUP = 32  # groups up to this many channels may read each token's scales as one row
GROUP_RUN = 32  # at WIDE_GROUP_HEAD_DIMS, groups of at least this many read one scale a run of 32 in place
# int8 groups of 64+ channels at CHUNK_HEAD_DIMS ("chunk"): exact dots over each 64-channel chunk's
# codes, scaled after the dot (kernel._attend_chunked); faster than "group" there only (BENCHMARKS.md, Kernel choices: chunk).
CHUNK_CHANNELS = 64
CHUNK_HEAD_DIMS = (128,)
WIDE_GROUP_HEAD_DIMS = (128, 256)  # head dims with a "group" variant (groups of 32+ that are not one a token)

KV_KIND = {"fp16": 0, "bf16": 0, "int8": 1, "int4": 2, "fp8_e4m3": 3, "fp8_e5m2": 4, "int4_zp": 5, "int4_rht": 5}
CACHE_DTYPE = {"fp16": "fp16", "bf16": "bf16", "int8": "int8", "int4": "int4",
               "fp8_e4m3": "int8", "fp8_e5m2": "int8", "int4_zp": "int4",
               "int4_rht": "int4"}

BLOCK_H = 16  # query heads of one KV group per program: the M of the QK^T tensor-core dot
# Splits a request at most: what the merge reads and an explicit num_splits may ask for. The
# workspace (workspace_elements) is batch x q_heads x splits x (head_dim + 1) fp32; the rules keep
# their counts near a wave of programs (num_splits; mla_spec.num_splits), an explicit count may
# take up to MAX_SPLITS.
MAX_SPLITS = 512
RULE_MAX_SPLITS = 64  # decode's rule: more splits lost at batch 1 (BENCHMARKS.md, Kernel choices: batch-1 splits)
MAX_BATCH = 65535  # the split grid's second dimension (CUDA's limit)
PROGRAMS_PER_SM = 4  # splits are added until the grid fills this many programs per SM


def block_d(head_dim: int) -> int:
    return 1 << (head_dim - 1).bit_length()


def block_n(head_dim: int, tile: str = "wide") -> int:
    """Tokens a tile: 128, best or within 5% for every format (BENCHMARKS.md, Kernel choices: block_n); 64 at head_dim 256
    (registers) and for the narrow tile (2 warps, `split_launch`)."""
    return 64 if tile == "narrow" or head_dim > 128 else 128


# int4's "narrow" tile (2 warps, 64-token tiles, 3 stages): the only tile of int4 at head_dim 64, and
# for int4 one scale a token at head_dim 128 taken when the grid at RULE_MAX_SPLITS splits holds this many
# programs an SM (the binary's occupancy); small grids lose with it (BENCHMARKS.md, Kernel choices: narrow tile). The choice
# depends on batch and heads, never on lengths, so a captured graph keeps its binary.
NARROW_PROGRAMS_PER_SM = 6


def split_tiles(kv: str, head_dim: int, scales: str) -> tuple[str, ...]:
    """The tiles declared for a variant, preferred first when the grid is large enough."""
    if kv in ("int4",) + ZP_FORMATS and head_dim == 64:
        return ("narrow",)
    if kv in ("int4",) + ZP_FORMATS and head_dim == 128 and scales == "token":
        return ("narrow", "wide")
    return ("wide",)


def choose_tile(tiles: tuple[str, ...], base_programs: int, sm_count: int) -> str:
    """Of a variant's tiles, the narrow one when `base_programs` (batch x KV heads x head blocks) at
    RULE_MAX_SPLITS splits gives every SM NARROW_PROGRAMS_PER_SM programs; else the wide one."""
    if len(tiles) == 1:
        return tiles[0]
    return "narrow" if base_programs * RULE_MAX_SPLITS >= NARROW_PROGRAMS_PER_SM * sm_count else "wide"


SCORES = ("plain", "mod")
# 16: the cache as the specialization level says (none assumed at GENERIC); 4: rows 4-byte aligned;
# 8: vLLM's per-token-head record exactly (kernel.py's docstring), K 8-byte aligned and V 4 past that
KV_ALIGNS = (16, 4, 8)
# fp8 with one scale a token and KV head ("token"): vLLM's FP8_PER_TOKEN_HEAD, e4m3 on CUDA.
FP8_PER_TOKEN_FORMATS = ("fp8_e4m3",)


def check_dtypes(q: str, kv: str, kv_formats: tuple[str, ...]) -> None:
    """ValueError unless q is a query dtype, kv one of kv_formats, and a 16-bit cache the query's dtype."""
    if q not in Q_DTYPES:
        raise ValueError(f"query dtype must be one of {Q_DTYPES}, got {q}")
    if kv not in kv_formats:
        raise ValueError(f"kv_format must be one of {kv_formats}, got {kv}")
    if kv in ("fp16", "bf16") and kv != q:
        raise ValueError(f"an {kv} cache needs an {kv} query, got {q}")


def split_axes(q: str, kv: str, scale: str, head_dim: int, per_token: bool = False, quant_group: int = 0,
               tile: str | None = None, channel: bool = False, score: str = "plain", kv_align: int = 16) -> dict:
    """The split kernel's axes for a call; ValueError if no variant can serve it. per_token: an
    int8/int4 cache with one scale a token (quantization group == head_dim); else quant_group, the
    channels a scale covers (int8/int4), picks "chunk" (int8, >= CHUNK_CHANNELS at CHUNK_HEAD_DIMS),
    "group" (>= GROUP_RUN at WIDE_GROUP_HEAD_DIMS) or "small_group" (<= MAX_SMALL_GROUP).
    tile: one of `split_tiles` (None: the first, which the op replaces with `choose_tile`'s).
    channel: an int8 cache with fp32 scales [kv_heads, head_dim] ("channel"). per_token also
    serves fp8 e4m3 (fp32 scales). score "mod" (softcap, ALiBi) and kv_align 4 exist for the
    vllm_variants only: float and fp8 caches without per-token scales take "mod" at kv_align 16;
    per-token int8/fp8 caches take kv_align 4 with either score."""
    check_dtypes(q, kv, KV_FORMATS)
    if kv in INT_FORMATS:
        if scale not in SCALE_DTYPES:
            raise ValueError(f"{kv} scales must be one of {SCALE_DTYPES}, got {scale}")
    elif scale != "fp32":
        raise ValueError(f"a {kv} cache takes fp32 scales (placeholder for fp16/bf16), got {scale}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}")
    if kv in ZP_FORMATS and not per_token:
        raise ValueError(f"an {kv} cache has one scale a token (per_token=True)")
    if per_token and (kv not in INT_FORMATS + FP8_PER_TOKEN_FORMATS + ZP_FORMATS
                      or head_dim not in PER_TOKEN_HEAD_DIMS):
        raise ValueError(f"one scale a token is for int8/int4/{'/'.join(FP8_PER_TOKEN_FORMATS)} caches of head_dim "
                         f"{PER_TOKEN_HEAD_DIMS}, not {kv} at head_dim {head_dim}")
    if per_token and kv in FP8_PER_TOKEN_FORMATS and kv_align == 16:
        raise ValueError("fp8 with one scale a token is built at kv_align 4 or 8 only (vLLM's FP8_PER_TOKEN_HEAD)")
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    if kv_align not in KV_ALIGNS:
        raise ValueError(f"kv_align must be one of {KV_ALIGNS}, got {kv_align!r}")
    if kv_align in (4, 8) and not (per_token and scale == "fp32" and kv in ("int8",) + FP8_PER_TOKEN_FORMATS):
        raise ValueError(f"kv_align {kv_align} is for int8/fp8 caches with one fp32 scale a token, not {kv} "
                         f"({'per token' if per_token else 'other scales'}, {scale})")
    if score == "mod" and not (kv_align in (4, 8) or (kv not in INT_FORMATS and not per_token)):
        raise ValueError(f"score 'mod' (softcap, ALiBi) is for fp16/bf16/fp8 caches and vLLM's per-token int8/fp8 "
                         f"caches (kv_align 4), not {kv} with these scales")
    if channel and (kv != "int8" or scale != "fp32" or per_token or quant_group):
        raise ValueError(f"per-channel scales are for int8 caches with fp32 scales, not {kv} with {scale} scales")
    if kv not in INT_FORMATS and not per_token:
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
    axes = {"q": q, "kv": kv, "scale": scale, "head_dim": head_dim, "cache": CACHE_DTYPE[kv], "scales": scales,
            "tile": tile}
    if score != "plain" or kv_align != 16:  # vLLM's variants; the others' keys stay as they were
        axes.update(score=score, kv_align=kv_align)
    return axes


MERGE_ONE_TILE = 64  # split counts up to this merge in one [splits, head_dim] tile
# Counts up to MERGE_WIDE_SPLITS (MLA's batch-1 rule: 256) merge in one [MERGE_WIDE_SPLITS,
# MERGE_LOOP_D] tile a program, channels spread over programs: the looping merge's two passes
# over the log-sum-exps cost batch 1 a chain of dependent reads (BENCHMARKS.md, "Small-batch decode").
MERGE_WIDE_SPLITS = 256
MERGE_SPLIT_TILES = (4, 16, MERGE_ONE_TILE, MERGE_WIDE_SPLITS, MAX_SPLITS)
# The 64- and 256-split tiles (counts that come with small batches) merge 32 channels a program:
# more, shorter programs finish sooner than a few whole heads (BENCHMARKS.md, "Small-batch decode").
MERGE_NARROW_D = 32
# Past one tile the merge loops over MERGE_LOOP_SPLITS splits at a time, and spreads each head's
# channels over programs of MERGE_LOOP_D: many splits come with small batches, whose (batch x
# heads) programs alone would leave most SMs idle.
MERGE_LOOP_SPLITS, MERGE_LOOP_D = 64, 64


def merge_split_tile(splits: int) -> int:
    """The smallest merge tile that holds `splits` partial results: one [MAX_SPLITS, BLOCK_D] tile for
    every call made the merge a wave of register-heavy programs (BENCHMARKS.md, Kernel choices: merge tile).
    Past MERGE_ONE_TILE: MERGE_WIDE_SPLITS (one tile over channel blocks), then MAX_SPLITS, the looping merge."""
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
    """Splits of each sequence: enough programs to fill every SM, never past RULE_MAX_SPLITS.

    Depends on no length, so a captured CUDA graph replays at any length. The base count gives
    PROGRAMS_PER_SM programs an SM (batch 1 with 8 KV heads on 132 SMs: 64 splits, batch 32: 3).
    Given the variant's real occupancy (`programs_per_sm`, from the binary), the count moves to the
    nearest one whose programs fill their last wave to >= 95% (none within RULE_MAX_SPLITS, or four
    waves and more already: the base count; BENCHMARKS.md, Kernel choices: num_splits). The workspace
    follows: at most max(batch x q_heads, 8 x SMs x BLOCK_H) rows of head_dim + 1 floats (8.7 MB at
    head_dim 128 on 132 SMs; more only where batch x q_heads alone is more).
    """
    base = max(1, batch * kv_heads * head_blocks(group))
    splits = max(1, min(RULE_MAX_SPLITS, -(-PROGRAMS_PER_SM * sm_count // base)))
    slots = (programs_per_sm or 0) * sm_count
    if not slots or base * splits >= 4 * slots:  # unknown, or four waves and more: little to gain
        return splits

    def filled(s: int) -> bool:
        programs = base * s
        return programs >= 0.95 * slots * -(-programs // slots)

    for step in range(RULE_MAX_SPLITS):
        for s in (splits - step, splits + step):
            if 1 <= s <= RULE_MAX_SPLITS and filled(s):
                return s
    return splits


def split_grid(batch: int, kv_heads: int, group: int, splits: int) -> tuple[int, int, int]:
    """KV head (block) fastest: programs that run together read the same pages, each head's slice of a
    token being only head_dim or head_dim / 2 bytes (BENCHMARKS.md, Kernel choices: split grid)."""
    return (kv_heads * head_blocks(group), batch, splits)


def merge_grid(batch: int, q_heads: int, merge_axes) -> tuple[int, int, int]:
    """(request, head, channel block): one channel block except for the looping merge."""
    c = merge_constexprs(merge_axes)
    return (batch, q_heads, -(-c["HEAD_DIM"] // c["BLOCK_D"]))


def workspace_elements(batch: int, q_heads: int, splits: int, head_dim: int) -> tuple[int, int]:
    """fp32 elements of the partial outputs and of the log-sum-exps."""
    return batch * q_heads * splits * head_dim, batch * q_heads * splits


# --- split kernel ---------------------------------------------------------------------------

_I32 = "i32"


def split_pointers(scale_dtype: str) -> tuple[Arg, ...]:
    """The leading pointers of decode's and MLA's split kernels (KS and VS of scale_dtype)."""
    return (
        Arg("Q", "ptr", aligned=True, dtype="q"),
        Arg("K", "ptr", aligned=True, dtype="cache"),
        Arg("V", "ptr", aligned=True, dtype="cache"),
        Arg("KS", "ptr", dtype=scale_dtype),
        Arg("VS", "ptr", dtype=scale_dtype),
        Arg("Table", "ptr", dtype="=i32"),
        Arg("ReqIdx", "ptr", dtype="=i32"),
        Arg("SeqLens", "ptr", dtype="=i32"),
        Arg("PartO", "ptr", aligned=True, dtype="=fp32"),
        Arg("PartLse", "ptr", aligned=True, dtype="=fp32"),
    )


# The runtime ints and the q/K/V strides both split kernels take after sm_scale, in this order.
SPLIT_INTS = ("window", "use_req_idx", "page_shift", "max_pages", "stride_table", "q_heads", "group")
SPLIT_STRIDES = ("stride_qb", "stride_qh", "stride_kp", "stride_kt", "stride_kh", "stride_vp", "stride_vt",
                 "stride_vh")
SPLIT_ARGS = (
    *split_pointers("scale"),
    # ALiBi slopes [q_heads] fp32, read by "mod" binaries only (alibi_mode below); among the leading
    # pointers, which a prepared launch repacks every call.
    Arg("Alibi", "ptr", dtype="=fp32"),
    Arg("sm_scale", "fp32"),
    *(Arg(n, _I32) for n in (*SPLIT_INTS, "quant_shift")),
    *(Arg(n, _I32, aligned=True) for n in SPLIT_STRIDES),
    *(Arg(n, _I32) for n in ("stride_ksp", "stride_kst", "stride_ksh",
                             "stride_vsp", "stride_vst", "stride_vsh")),
    # Score options, read by "mod" binaries only: softcap (0: off); alibi_mode 0 off, 1 linear
    # (slope * (key position - (seq_len - 1))), 2 vLLM's sqrt form (-slope * sqrt(distance)).
    Arg("softcap", "fp32"),
    Arg("alibi_mode", _I32),
)


def split_constexprs(axes) -> dict:
    hd = int(axes["head_dim"])
    return {"HEAD_DIM": hd, "BLOCK_D": block_d(hd), "BLOCK_N": block_n(hd, str(axes["tile"])), "BLOCK_H": BLOCK_H,
            "KV_KIND": KV_KIND[str(axes["kv"])], "PER_TOKEN": int(axes["scales"] == "token"),
            "ROW_SCALES": int(axes["scales"] == "small_group"), "CHUNK_SCALES": int(axes["scales"] == "chunk"),
            "CHANNEL_SCALES": int(axes["scales"] == "channel"), "SCORE_MOD": int(axes.get("score", "plain") == "mod"),
            "KV_ALIGN": int(axes.get("kv_align", 16)), "RHT": int(axes["kv"] == "int4_rht")}


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
        yield from vllm_variants(q)


def vllm_variants(q: str):
    """The variants vLLM's unified_attention needs beyond the others, for one query dtype: scores
    with softcap/ALiBi over fp16/bf16/fp8 caches (4 head dims x 3 formats), and its per-token-head
    int8 / fp8 e4m3 caches with fp32 scales at kv_align 4 and 8, plain and "mod" (2 head dims x 2 x
    2 x 2), and its INT4_PER_TOKEN_HEAD codes ("int4_zp" and "int4_rht": head dim 64's narrow tile,
    128's narrow and wide): 34 a query dtype."""
    for kv in (q, "fp8_e4m3", "fp8_e5m2"):
        for hd in HEAD_DIMS:
            yield split_axes(q, kv, "fp32", hd, score="mod")
    for kv in ZP_FORMATS:  # vLLM's INT4_PER_TOKEN_HEAD: plain scores, any 2-byte-aligned rows
        for hd in PER_TOKEN_HEAD_DIMS:
            axes = split_axes(q, kv, "fp32", hd, per_token=True)
            for tile in split_tiles(kv, hd, axes["scales"]):
                yield dict(axes, tile=tile)
    for kv in ("int8",) + FP8_PER_TOKEN_FORMATS:
        for hd in PER_TOKEN_HEAD_DIMS:
            for score in SCORES:
                for align in (4, 8):
                    axes = split_axes(q, kv, "fp32", hd, per_token=True, score=score, kv_align=align)
                    for tile in split_tiles(kv, hd, axes["scales"]):
                        yield dict(axes, tile=tile)


def split_launch(axes, arch: int) -> LaunchConfig:
    # 4 warps lead every format; per-group scales capped at 168 registers fit three programs an SM
    # instead of two (BENCHMARKS.md, Kernel choices: split launch).
    pdl = arch >= 90  # a programmatic dependent launch on sm90+ (kernel.py: the PDL constexpr)
    # int4_rht: capped at int4_zp's register counts (sm90), so its in-kernel rotations (before and
    # after the loop) cost no programs an SM
    rht = axes["kv"] == "int4_rht"
    if axes["tile"] == "narrow":  # 2 warps, 64-token tiles, 3 stages (see NARROW_PROGRAMS_PER_SM)
        cap = {64: 168, 128: 184}[int(axes["head_dim"])] if rht else 0
        return LaunchConfig(num_warps=2, num_stages=3, maxnreg=cap, launch_pdl=pdl)
    grouped = axes["scales"] in ("group", "small_group")
    cap = 168 if grouped and int(axes["head_dim"]) <= 128 else 0
    # int8 per-token: 2 stages keep it at 168 registers, three programs an SM. int4 per-group: 3 stages
    # with its table load hidden from the pipeliner (kernel._pages_nc).
    # "channel" takes int8 per-token's config (its loop, minus the scale loads): not measured yet.
    stages = 3 if grouped or axes["scales"] == "chunk" else 2  # chunk: 146 registers, no cap (CHUNK_CHANNELS)
    if axes.get("kv_align") == 8 and axes["kv"] != "int8":
        # vLLM's fp8 record (8- and 4-byte reads): capped at 168 registers, three programs an SM; the
        # int8 loop lost with the cap (BENCHMARKS.md, "Decode on vLLM's per-token-head caches")
        cap = 168
    if grouped and int(axes["head_dim"]) > 128:
        # Head dim 256: "small_group" 2 stages, int4 "group" capped at 168, int8 "group" 2 stages capped
        # at 168 (three programs an SM), each faster in every measured cell (BENCHMARKS.md, Kernel choices: head dim 256).
        if axes["scales"] == "small_group":
            stages = 2
        elif axes["kv"] == "int4":
            cap = 168
        else:
            stages, cap = 2, 168
    return LaunchConfig(num_warps=4, num_stages=stages, maxnreg=168 if rht else cap, launch_pdl=pdl)


SPLIT = KernelSpec(
    name="decode_split",
    module="aotc.kernels.decode.kernel",
    sources=("kernel.py",),
    function="decode_split_kernel",
    args=SPLIT_ARGS,
    constexpr_names=("HEAD_DIM", "BLOCK_D", "BLOCK_N", "BLOCK_H", "KV_KIND", "PER_TOKEN", "ROW_SCALES", "CHUNK_SCALES",
                     "CHANNEL_SCALES", "SCORE_MOD", "KV_ALIGN", "PDL", "PTX", "RHT"),
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
    hd, tile = int(axes["head_dim"]), int(axes["splits"])
    if tile < MERGE_ONE_TILE:
        return {"HEAD_DIM": hd, "BLOCK_D": block_d(hd), "BLOCK_S": tile, "LOOP": 0}
    if tile <= MERGE_WIDE_SPLITS:
        return {"HEAD_DIM": hd, "BLOCK_D": MERGE_NARROW_D, "BLOCK_S": tile, "LOOP": 0}
    return {"HEAD_DIM": hd, "BLOCK_D": min(MERGE_LOOP_D, block_d(hd)), "BLOCK_S": MERGE_LOOP_SPLITS, "LOOP": 1}


def merge_variants():
    for out in Q_DTYPES:
        for hd in HEAD_DIMS:
            for tile in MERGE_SPLIT_TILES:
                yield merge_axes(out, hd, tile)


def merge_launch(axes, arch: int) -> LaunchConfig:
    # The [BLOCK_S, BLOCK_D] fp32 tile at <= 64 elements a thread (64 x 128 at 4 warps). sm90+:
    # a programmatic dependent launch (the kernel's PDL constexpr follows it).
    # The looping merge: 2 stages, so the next tile's loads are in flight during this one's sum.
    c = merge_constexprs(axes)
    elements = c["BLOCK_S"] * c["BLOCK_D"]
    return LaunchConfig(num_warps=max(1, min(8, elements // (64 * 32))), num_stages=2 if c["LOOP"] else 1,
                        launch_pdl=arch >= 90)


MERGE = KernelSpec(
    name="decode_merge",
    module="aotc.kernels.decode.kernel",
    sources=("kernel.py",),
    function="decode_merge_kernel",
    args=MERGE_ARGS,
    constexpr_names=("HEAD_DIM", "BLOCK_D", "BLOCK_S", "LOOP", "PDL"),
    constexprs=merge_constexprs,
    variants=merge_variants,
    launch=merge_launch,
)

KERNELS = (SPLIT, MERGE)
