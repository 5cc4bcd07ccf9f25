"""Variant table and launch geometry of MLA / unequal-head decode (`mla_kernel.py`): a decode kernel
beside decode's own, sharing its merge kernel and split rule.

Split kernel axes: `q` (fp16, bf16), `kv` (the query's own dtype, fp8_e4m3, fp8_e5m2), `d_qk` and
`d_v` (the key and value head sizes: multiples of 16 up to MAX_D_QK / MAX_D_V), `layout`
("latent": one cache whose first d_v channels are the value, read once; "separate": K and V
caches), `tile` (query heads a program: "h16", 16 heads, 4 warps; "h32", 32 heads, 8 warps (the
latent layout); "h64", 64 heads, 8 warps, the compute-bound shape for 64+ heads a KV head on
sm90), plus `cache`, the element type the kernel
reads (fp8 as raw int8 bytes), which follows from `kv`. Declared (built) pairs: DECLARED_PAIRS;
any other pair of multiples of 16 runs through the JIT fallback. Merge: decode's merge kernel
(kernels/decode/kernel.py) at head_dim d_v, declared here for the d_v values decode lacks.
Declared for NVIDIA targets (sm80, sm90) only. Page size, window, group size and lengths are
runtime arguments; split counts follow batch, heads and occupancy (num_splits), never lengths.
"""
from __future__ import annotations

from . import spec as D
from ..variants import Arg, KernelSpec, LaunchConfig

Q_DTYPES = D.Q_DTYPES
KV_FORMATS = ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2")
KV_KIND = {"fp16": 0, "bf16": 0, "fp8_e4m3": 3, "fp8_e5m2": 4}
CACHE_DTYPE = {"fp16": "fp16", "bf16": "bf16", "fp8_e4m3": "int8", "fp8_e5m2": "int8"}
LAYOUTS = ("latent", "separate")
MAX_D_QK, MAX_D_V, D_STEP = 576, 512, 16
MAX_PAGE_SIZE = 128
# (d_qk, d_v, layout, cache formats, tiles) built ahead of time ("q": the query's own dtype):
# DeepSeek V2/V3's latent cache, and the unequal pairs vLLM 0.33's own decode test runs through
# separate caches (its fp8 cases at 576 and 128 only; its groups are at most 32 heads).
_FP8 = ("q", "fp8_e4m3")
DECLARED = ((576, 512, "latent", _FP8, ("h16", "h32", "h64")), (576, 512, "separate", _FP8, ("h16",)),
            (192, 128, "separate", ("q",), ("h16",)), (128, 512, "separate", _FP8, ("h16",)),
            (192, 512, "separate", ("q",), ("h16",)), (576, 128, "separate", _FP8, ("h16",)))
# tile -> (BLOCK_H, num_warps, BLOCK_N). bench/bench_mla.py --sweep, H100, latent bf16, page 64
# (BENCHMARKS.md, "MLA decode"): at 128 heads 64 heads a program at 8 warps over 64-token tiles
# led; at 16 heads 32-token tiles at 4 warps (64 tokens, 8 or 2 warps, 16 tokens all slower); at
# 32 heads, 32 a program at 8 warps over 64 tokens beat 16 or 32 at 4 warps over 32 tokens.
TILES = {"h16": (16, 4, 32), "h32": (32, 8, 64), "h64": (64, 8, 64)}
WIDE_TILE_GROUP = 64  # groups of at least this many heads take "h64" where it is built (sm90+)
MID_TILE_GROUP = 32  # and of at least this many "h32"


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 0 else 0


def key_blocks(d_qk: int, d_v: int, layout: str) -> tuple[int, int]:
    """(BLOCK_A, BLOCK_B): the key's two channel tiles. Latent: A holds the value's channels
    (next power of two of d_v) and B the rest; separate: A is the largest power of two <= d_qk.
    B, where needed, is a power of two >= 16 (a dot's smallest K)."""
    a = _pow2(d_v) if layout == "latent" else 1 << (d_qk.bit_length() - 1)
    a = min(a, _pow2(d_qk))
    rest = d_qk - a
    return a, (max(16, _pow2(rest)) if rest > 0 else 0)


def block_n(axes) -> int:
    """Tokens a tile: the tile's (TILES), or 32 where two stages of a 64-token tile (K, and V when
    separate) would pass ~150 KB of shared memory."""
    a, b = key_blocks(int(axes["d_qk"]), int(axes["d_v"]), str(axes["layout"]))
    cols = a + b + (0 if axes["layout"] == "latent" else _pow2(int(axes["d_v"])))
    n = TILES[str(axes["tile"])][2]
    return n if 2 * n * cols * 2 <= 150 * 1024 else 32


def split_axes(q: str, kv: str, d_qk: int, d_v: int, layout: str, tile: str = "h16") -> dict:
    """The split kernel's axes for a call; ValueError naming what no variant can serve."""
    D.check_dtypes(q, kv, KV_FORMATS)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if not (D_STEP <= d_qk <= MAX_D_QK and d_qk % D_STEP == 0):
        raise ValueError(f"key head size {d_qk}: expected a multiple of {D_STEP} in [{D_STEP}, {MAX_D_QK}]")
    if not (D_STEP <= d_v <= MAX_D_V and d_v % D_STEP == 0):
        raise ValueError(f"value head size {d_v}: expected a multiple of {D_STEP} in [{D_STEP}, {MAX_D_V}]")
    if layout == "latent" and d_v > d_qk:
        raise ValueError(f"latent layout: v_head_dim {d_v} is larger than the cache's {d_qk} channels")
    if tile not in TILES:
        raise ValueError(f"tile must be one of {tuple(TILES)}, got {tile!r}")
    return {"q": q, "kv": kv, "cache": CACHE_DTYPE[kv], "d_qk": d_qk, "d_v": d_v, "layout": layout, "tile": tile}


def choose_tile(group: int, arch: int, layout: str = "latent") -> str:
    """64 heads a program for groups of 64+ on sm90 (wgmma's M is 64 a warpgroup), 32 for groups of
    32+ (the latent layout: the tiles built), else 16."""
    if layout != "latent":
        return "h16"
    if group >= WIDE_TILE_GROUP and arch >= 90:
        return "h64"
    return "h32" if group >= MID_TILE_GROUP else "h16"


def head_blocks(group: int, tile: str) -> int:
    return -(-group // TILES[tile][0])


# Splits a request at most under the rule: past it the partial outputs (BLOCK_H x d_v fp32 a
# split, 32 KB at 16 heads x 512) cost more than the extra SMs bring (BENCHMARKS.md, "MLA decode":
# batch 1 x 32K at 16 heads, 264 splits beat 396 and 512).
RULE_MAX_SPLITS = 256
# The double-buffered tiles (page_ahead) stop earlier: their programs read a 32-token tile's
# successor during its dots, and at batch 1 128 splits beat 256 (BENCHMARKS.md, "MLA decode",
# Configuration).
PAGE_AHEAD_MAX_SPLITS = 128


def max_splits(axes, arch) -> int:
    """The rule's cap for a variant on a target (`num_splits`'s `cap`)."""
    return PAGE_AHEAD_MAX_SPLITS if page_ahead(axes, arch) else RULE_MAX_SPLITS


def num_splits(batch: int, kv_heads: int, group: int, tile: str, sm_count: int,
               programs_per_sm: int | None = None, cap: int = RULE_MAX_SPLITS) -> int:
    """Splits of each sequence: one wave of programs, (batch x KV heads x head blocks) a split,
    never past `cap` (`max_splits`: RULE_MAX_SPLITS, PAGE_AHEAD_MAX_SPLITS for the double-buffered
    tiles); the occupancy `programs_per_sm` comes from the binary (unknown: decode's
    PROGRAMS_PER_SM). The most splits that keep every program in the first wave: a
    second, partial wave and the partials of more, shorter splits cost more than they bring
    (BENCHMARKS.md, "MLA decode": 16 heads at batch 32 x 4K, 8 splits 71 us, 16 80 us; 128 heads
    at batch 32 x 4K, 2 splits 188 us, 3 248 us, 9 260 us).
    Depends on no length, so a captured CUDA graph replays at any length. Workspace: at most
    max(batch x q_heads, slots x BLOCK_H) rows of d_v + 1 floats: at d_v 512 on 132 SMs 8.7 MB for
    the 16-head tile (two programs an SM) and 17.3 MB for the 64-head one (one an SM)."""
    base = max(1, batch * kv_heads * head_blocks(group, tile))
    slots = (programs_per_sm or D.PROGRAMS_PER_SM) * sm_count
    return max(1, min(cap, slots // base))


def split_grid(batch: int, kv_heads: int, group: int, tile: str, splits: int) -> tuple[int, int, int]:
    return (kv_heads * head_blocks(group, tile), batch, splits)


# --- split kernel ---------------------------------------------------------------------------

_I32 = "i32"
SPLIT_ARGS = (
    *D.split_pointers("=fp32"),
    Arg("sm_scale", "fp32"),
    *(Arg(n, _I32) for n in D.SPLIT_INTS),
    *(Arg(n, _I32, aligned=True) for n in D.SPLIT_STRIDES),
)


def split_constexprs(axes) -> dict:
    d_qk, d_v, layout = int(axes["d_qk"]), int(axes["d_v"]), str(axes["layout"])
    a, b = key_blocks(d_qk, d_v, layout)
    return {"D_QK": d_qk, "D_V": d_v, "BLOCK_A": a, "BLOCK_B": b,
            "BLOCK_DV": a if layout == "latent" else _pow2(d_v), "BLOCK_N": block_n(axes),
            "BLOCK_H": TILES[str(axes["tile"])][0], "LATENT": int(layout == "latent"), "KV_KIND": KV_KIND[str(axes["kv"])]}


def split_variants():
    for q in Q_DTYPES:
        for d_qk, d_v, layout, kvs, tiles in DECLARED:
            for kv in kvs:
                for tile in tiles:
                    yield split_axes(q, q if kv == "q" else kv, d_qk, d_v, layout, tile)


def _cuda(arch) -> bool:
    # NVIDIA targets only: AMD's 64 KB of LDS has not been tried with these tiles, nor any AMD GPU.
    return getattr(arch, "backend", "cuda") == "cuda"


def page_ahead(axes, arch) -> bool:
    """The 16- and 32-head latent tiles over a 16-bit cache on sm90: page ids loaded one tile ahead
    and 3 stages, so each tile's copy is double-buffered (h16 93 KB of shared memory, still 2
    programs an SM; h32 188 KB, 1 as before; sm80's 164 KB would hold one h16 and no h32).
    Elsewhere 2 stages and one buffer: tile i+1's copy is issued after tile i's dots and waited
    for at the top of the next iteration."""
    return (_cuda(arch) and arch >= 90 and axes["tile"] in ("h16", "h32") and axes["layout"] == "latent"
            and KV_KIND[str(axes["kv"])] == 0)


def split_target_constexprs(axes, arch) -> dict:
    return {**D.ptx_constexprs(axes, arch), "PAGE_AHEAD": int(page_ahead(axes, arch))}


def split_launch(axes, arch: int) -> LaunchConfig | None:
    # "h64" holds a [64, D_V] fp32 accumulator: wgmma territory (sm90); not declared below it.
    if not _cuda(arch) or (axes["tile"] == "h64" and arch < 90):
        return None
    return LaunchConfig(num_warps=TILES[str(axes["tile"])][1], num_stages=3 if page_ahead(axes, arch) else 2,
                        launch_pdl=arch >= 90)


SPLIT = KernelSpec(
    name="mla_split",
    module="aotc.kernels.decode.mla_kernel",
    function="mla_split_kernel",
    args=SPLIT_ARGS,
    constexpr_names=("D_QK", "D_V", "BLOCK_A", "BLOCK_B", "BLOCK_DV", "BLOCK_N", "BLOCK_H", "LATENT", "KV_KIND",
                     "PAGE_AHEAD", "PDL", "PTX"),
    constexprs=split_constexprs,
    variants=split_variants,
    launch=split_launch,
    target_constexprs=split_target_constexprs,
)

# --- merge: decode's kernel at this family's value head sizes ------------------------------------

MERGE_HEAD_DIMS = tuple(sorted({row[1] for row in DECLARED} - set(D.HEAD_DIMS)))


def merge_axes(out: str, d_v: int, splits: int) -> dict:
    if out not in Q_DTYPES:
        raise ValueError(f"output dtype must be one of {Q_DTYPES}, got {out}")
    return {"out": out, "head_dim": d_v, "splits": D.merge_split_tile(splits)}


def merge_spec(d_v: int) -> KernelSpec:
    """decode's merge where it declares d_v, else this family's declaration of the same kernel."""
    return D.MERGE if d_v in D.HEAD_DIMS else MERGE


def merge_variants():
    for out in Q_DTYPES:
        for d_v in MERGE_HEAD_DIMS:
            for tile in D.MERGE_SPLIT_TILES:
                yield merge_axes(out, d_v, tile)


def merge_launch(axes, arch: int) -> LaunchConfig | None:
    return D.merge_launch(axes, arch) if _cuda(arch) else None


MERGE = KernelSpec(
    name="mla_merge",
    module="aotc.kernels.decode.kernel",
    sources=("kernel.py",),
    function="decode_merge_kernel",
    args=D.MERGE_ARGS,
    constexpr_names=D.MERGE.constexpr_names,
    constexprs=D.merge_constexprs,
    variants=merge_variants,
    launch=merge_launch,
)

KERNELS = (SPLIT, MERGE)
