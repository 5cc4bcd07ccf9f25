"""Variants of the gated delta rule's recurrent decode kernel (recurrent.py).

Axes (constexpr in the kernel):
  dtype   q/k/v and output: fp16, bf16, fp32
  k_dim   the K tile BK: 64, 128, 256 (the state tile holds a whole row of K); K itself is a
          runtime int, any value up to the tile (block_k(K) picks the tile; K = 60 runs at 64)
  layout  the state pool: vmajor [slots, HV, V, K] (K contiguous) or kmajor [slots, HV, K, V]
  gate    gdn (one log-gate a head: a scalar, PER_K 0) or kda (one a head and K channel: a
          [BK] vector, PER_K 1). Apart because the scalar path holds fewer registers.
  rows    strided (runtime row stride, K and V masked) or packed (V-major only: K the tile, rows
          K apart, V a multiple of BV; the tile's offsets are immediates off one base, no mask:
          PACKED 1; rows_form picks it)
  tokens  any (the token loop) or one (packed only: a one-token step without the loop, NT 1;
          the loop's registers cost a one-token step 1-2 points at the cap a longer one wants),
          or long (GDN at K = 128, T >= LONG_FROM: the packed V-major loop with its rows split,
          KS 2, at cap 80; K-major at cap 72: fewer instructions or more programs a token, which
          pays where the loop is long and costs where it is short)
K-major 3 * 3 * 2 + 3 long = 21 variants, V-major 18 strided + 18 packed + 18 packed one-token + 3
packed long: 57; 78, each
built at two specialization levels per arch. Everything else is runtime: K, V (any size up to
512; the grid tiles it), T, heads and GVA group (a shift where a power of two), the fused-gate
form, q/k L2 norm, the dtypes of the gate tensors (a code each: fp32, fp16, bf16), and the dense
form (no state indices: row b's state is state[b]).

The tile: BV value rows x K, fp32, held in registers across the T tokens, 32 floats a thread,
BV = 1024 // K (16, 8, 4) and one warp, in both layouts except KDA K-major. This is the shape
of flash-linear-attention's fused_recurrent (BV 8, one warp at K = 128). One warp keeps every
reduction inside the warp (a 4-warp tile adds cross-warp reductions, barriers and registers).
  The register cap (maxnreg) sets how many one-warp programs an SM holds: 64 registers -> 32
  (the most an SM takes), 72 -> 28, 80 -> 25, 96 -> 21. Compiled for sm90 at K = 128 without a
  cap, ptxas takes GDN V-major 126, K-major 111 (one warp), KDA 128 (V-major and K-major, 4
  warps); GDN's caps (72 V-major, 80 at K = 256; 80 K-major) keep its token loop free of spills (what spills is
  the state tile's store offsets, stored once before the loop and read once after it) and were
  the fastest measured (H100; at 64 ptxas runs the row reductions one after another: T = 1 lost
  6 points of copy). KDA V-major: 96 (what it took before token 0 ran ahead of the loop; none at
  K = 256, where 96 spills); KDA K-major: none.
  kda kmajor: BV = 32, K // 32 warps (each K row of the tile one 128-byte line); it also runs
    K-major GDN steps of one token (binary_gate).
  Packed tiles hold fewer registers (no row offsets, masks or token loop): _CAP_PACKED gives
  each its smallest spill-free cap; the one-token GDN step at K = 128 fits 64 (32 programs an
  SM, fla's count). The packed loop keeps 72: at 64, spilling one value, T = 4 gained, T = 2 and
  8 lost (BENCHMARKS.md, session 35); since the tile-first order it fits 64 without spills but
  runs its row reductions one after another, not yet timed (bench --sweep's cap-64 row).
num_stages 1: q/k/v are a few hundred bytes a token against the state tile (fla's num_stages=3
compiles to the same sm90 binary as 1: Triton pipelines no load of a loop without a dot).
bench/bench_gated_delta.py --sweep times the "any" and "long" loops at T 2..8 through the JIT.

Stdlib only: the build and the loader import this without torch or triton.
"""
from __future__ import annotations

from aotc.kernels.variants import Arg, KernelSpec, LaunchConfig

DTYPES = ("fp16", "bf16", "fp32")
K_DIMS = (64, 128, 256)  # the K tiles built; K itself is any size up to MAX_K
LAYOUTS = ("vmajor", "kmajor")
GATES = ("gdn", "kda")
ROWS = ("strided", "packed")
TOKENS = ("any", "one", "long")
MAX_T = 8  # tokens a request per decode call (speculative verify); more is prefill's job
MAX_K, MAX_V = 256, 512
GATE_CODES = {"fp32": 0, "fp16": 1, "bf16": 2}  # the kernel's runtime dtype codes of gate tensors

_GATE_PTRS = ("G", "Beta", "A_log", "Dt_bias")
_COUNTS = ("T", "group", "group_shift", "num_slots", "dense")
# Sizes and strides of rows that hold whole 16-byte vectors (K, V multiples of 16): the ALIGNED
# binary assumes them divisible by 16, which lets q/k/v/out and the state tile load as 16-byte
# vectors; other head sizes (60, 100) take the GENERIC binary.
_ALIGNED_INTS = ("K_DIM", "V_DIM", "stride_qb", "stride_qt", "stride_qh", "stride_kb", "stride_kt", "stride_kh",
                 "stride_vb", "stride_vt", "stride_vh", "stride_ob", "stride_ot", "stride_oh",
                 "stride_sn", "stride_sh", "stride_srow")
_GATE_INTS = ("stride_gb", "stride_gt", "stride_gh", "stride_gk", "stride_bb", "stride_bt", "stride_bh",
              "stride_dh", "stride_dk", "g_code", "beta_code", "alog_code", "dt_code", "fused", "qk_l2norm")

ARGS = (
    tuple(Arg(n, "ptr", aligned=True, dtype="dtype") for n in ("Q", "K", "V", "Out"))
    + tuple(Arg(n, "ptr", aligned=True, dtype="=fp32") for n in ("State", "State_out"))
    + tuple(Arg(n, "ptr", dtype="=u8") for n in _GATE_PTRS)
    + (Arg("Idx", "ptr", dtype="=i32"),)
    + (Arg("scale", "fp32"),)
    + tuple(Arg(n, "i32") for n in _COUNTS)
    + tuple(Arg(n, "i32", aligned=True) for n in _ALIGNED_INTS)
    + tuple(Arg(n, "i32") for n in _GATE_INTS)
)

CONSTEXPRS = ("BK", "BV", "KMAJOR", "PER_K", "PACKED", "NT", "KS")


def block_k(k: int) -> int:
    """The K tile (the `k_dim` axis) serving head size k <= MAX_K: the smallest built one >= k."""
    return next(t for t in K_DIMS if t >= k)


def block_v(k_dim: int, layout: str, gate: str = "gdn") -> int:
    """Value rows a program (see the module docstring)."""
    return 32 if (layout, gate) == ("kmajor", "kda") else 1024 // k_dim


# ptxas register cap a thread, by (layout, gate); 0: none (see the module docstring)
MAXNREG = {("vmajor", "gdn"): 72, ("kmajor", "gdn"): 80, ("vmajor", "kda"): 96, ("kmajor", "kda"): 0}


# The 256-column V-major tiles hold q and k (and KDA's gate) at eight values a thread: V-major GDN
# spills inside the token loop at 72 (not at 80), KDA at 96 (it runs uncapped there).
_CAP_256 = {("vmajor", "gdn"): 80, ("vmajor", "kda"): 0}


# Packed V-major tiles (rows == "packed"), by (k_dim, gate, tokens): the smallest cap each compiles
# spill-free at (sm90, every dtype).
_CAP_PACKED = {(64, "gdn", "one"): 72, (64, "gdn", "any"): 80, (64, "kda", "one"): 80, (64, "kda", "any"): 96,
               (128, "gdn", "one"): 64, (128, "gdn", "any"): 72, (128, "kda", "one"): 64, (128, "kda", "any"): 72,
               (256, "gdn", "one"): 80, (256, "gdn", "any"): 96, (256, "kda", "one"): 96, (256, "kda", "any"): 0}


# The long GDN loops at K = 128, by layout: the split packed V-major loop spills inside the loop at
# 72 (not at 80); K-major at 72, 28 programs an SM where 25 (14 spill instructions, none in the loop).
_CAP_LONG = {"vmajor": 80, "kmajor": 72}


def max_registers(k_dim: int, layout: str, gate: str, rows: str = "strided", tokens: str = "any") -> int:
    """The cap of a variant: _CAP_LONG's for a long loop, _CAP_PACKED's for a packed tile, else
    MAXNREG's, or _CAP_256's for a 256-column tile."""
    if tokens == "long":
        return _CAP_LONG[layout]
    if rows == "packed" and (k_dim, gate, tokens) in _CAP_PACKED:
        return _CAP_PACKED[k_dim, gate, tokens]
    if k_dim == 256 and (layout, gate) in _CAP_256:
        return _CAP_256[layout, gate]
    return MAXNREG[layout, gate]


def rows_form(layout: str, k: int, v: int, row_stride: int, gate: str) -> str:
    """The `rows` axis of a call: "packed" where the V-major state's rows are whole tiles (K a
    built tile, rows K apart, V a multiple of the rows a program: no mask and no runtime stride
    in the tile's addresses), else "strided"."""
    bk = block_k(k)
    packed = layout == "vmajor" and k == bk and row_stride == k and v % block_v(bk, layout, gate) == 0
    return "packed" if packed else "strided"


# The token count from which a GDN call at K = 128 runs the "long" binary, by layout: where the
# sweep's long loop first led (BENCHMARKS.md, gated delta decode against fla-core).
LONG_FROM = {"vmajor": 6, "kmajor": 4}


def tokens_form(rows: str, tokens: int, layout: str = "vmajor", k_dim: int = 0, gate: str = "gdn") -> str:
    """The `tokens` axis: "one" for a packed tile's one-token step (no token loop), "long" for a
    GDN call at K = 128 of LONG_FROM[layout] tokens or more (V-major: packed rows), else "any"."""
    if rows == "packed" and tokens == 1:
        return "one"
    long_ok = (k_dim, gate) == (128, "gdn") and (layout == "kmajor" or rows == "packed")
    return "long" if long_ok and tokens >= LONG_FROM[layout] else "any"


def group_shift(group: int) -> int:
    """log2 of the GVA group where it is a power of two (the kernel shifts), else -1 (it divides)."""
    return group.bit_length() - 1 if group & (group - 1) == 0 else -1


def binary_gate(kind: str, layout: str, tokens: int, fused: bool) -> str:
    """The `gate` axis of the binary that runs a call whose gate is `kind`: its own, except a
    K-major GDN step of one token (g and beta given, or the fused form's a and b), which runs the
    kda binary: its 4-warp 32-column tile, GDN's gate read as a vector of K stride 0 (the fused
    form's dt_bias too). Its 128-byte K rows keep the L2 under the one-warp tile's 32-byte rows'
    load (ncu, H100: L2 60% against 91%), and with token 0 read before the state tile it runs
    at ~88% of copy against the one-warp tile's ~64% at T = 1; at T = 4 the one-warp tile leads
    (~67 against ~54). BENCHMARKS.md, Kernel choices: one-token K-major tile."""
    return "kda" if (kind, layout, tokens) == ("gdn", "kmajor", 1) else kind


def k_split(k_dim: int, gate: str, rows: str, tokens: str) -> int:
    """KS, the parts of a state row one thread holds (recurrent.py): 2 for the packed GDN long
    token loop at K = 128 (rows on 16 lanes: 46 shuffles a token where 90), else 1."""
    return 2 if (k_dim, gate, rows, tokens) == (128, "gdn", "packed", "long") else 1


def constexprs(axes) -> dict:
    k = int(axes["k_dim"])
    return {"BK": k, "BV": block_v(k, axes["layout"], axes["gate"]), "KMAJOR": int(axes["layout"] == "kmajor"),
            "PER_K": int(axes["gate"] == "kda"), "PACKED": int(axes["rows"] == "packed"),
            "NT": int(axes["tokens"] == "one"), "KS": k_split(k, axes["gate"], axes["rows"], axes["tokens"])}


def variants():
    for dtype in DTYPES:
        for k in K_DIMS:
            for layout in LAYOUTS:
                for gate in GATES:
                    yield axes_for(dtype, k, layout, gate)
                    if layout == "vmajor":
                        yield axes_for(dtype, k, layout, gate, "packed")
                        yield axes_for(dtype, k, layout, gate, "packed", "one")
                    if (k, gate) == (128, "gdn"):
                        yield axes_for(dtype, k, layout, gate, "packed" if layout == "vmajor" else "strided", "long")


def launch(axes, arch: int) -> LaunchConfig:
    k, layout, gate = int(axes["k_dim"]), axes["layout"], axes["gate"]
    return LaunchConfig(num_warps=block_v(k, layout, gate) * k // 1024, num_stages=1,  # 32 floats a thread
                        maxnreg=max_registers(k, layout, gate, axes["rows"], axes["tokens"]))


def axes_for(dtype: str, k_dim: int, layout: str, gate: str, rows: str = "strided", tokens: str = "any") -> dict:
    return {"dtype": dtype, "k_dim": k_dim, "layout": layout, "gate": gate, "rows": rows, "tokens": tokens}


def grid(batch: int, hv: int, v_dim: int, bv: int) -> tuple[int, int, int]:
    """(cdiv(V, BV), HV, B): no length in it, and no division in the kernel to find a tile."""
    return (-(-v_dim // bv), hv, batch)


GRID_YZ_MAX = 65535  # CUDA's limit on a grid's second and third axes: HV and B


DECODE = KernelSpec(
    name="gated_delta_decode",
    module="aotc.kernels.gated_delta.recurrent",
    function="gated_delta_decode_kernel",
    args=ARGS,
    constexpr_names=CONSTEXPRS,
    constexprs=constexprs,
    variants=variants,
    launch=launch,
    sources=("recurrent.py",),
)

KERNELS = (DECODE,)
