"""Variants of the gated delta rule's recurrent decode kernel (recurrent.py).

Axes (constexpr in the kernel):
  dtype   q/k/v and output: fp16, bf16, fp32
  k_dim   the K tile BK: 64, 128, 256 (the state tile holds a whole row of K); K itself is a
          runtime int, any value up to the tile (block_k(K) picks the tile; K = 60 runs at 64)
  layout  the state pool: vmajor [slots, HV, V, K] (K contiguous) or kmajor [slots, HV, K, V]
3 * 3 * 2 = 18 variants, each built at two specialization levels per arch. Everything else is
runtime: K, V (any size up to 512; the grid tiles it), T, heads and GVA group, GDN vs KDA
gates (a K stride of 0 for GDN), the fused-gate form, q/k L2 norm, and the dtypes of the gate
tensors (a code each: fp32, fp16, bf16).

The tile: BV value rows x K, fp32, held in registers across the T tokens, 32 floats a thread.
  vmajor: BV = 1024 // K (16, 8, 4), one warp: a 4 KiB tile. This is the shape of
    flash-linear-attention's fused_recurrent (BV 8, one warp at K = 128), measured at 97.7% of copy
    bandwidth on the H100 (issue 19). Compiled for sm90 it takes 96 registers at K = 64 and 128
    (119 at 256), no spills, one barrier a token; the 4-warp 32 x 128 tile takes 128 registers
    and 17 barriers a token (cross-warp reductions), so it fits fewer programs an SM.
  kmajor: BV = 32, so each K row of the tile is 128 contiguous bytes (one cache line; fla's K-first
    path reads 32-byte rows, BV 8, and reaches 81%), K // 32 warps (125-127 registers on sm90).
num_stages 1: the token loop carries no loads worth pipelining (q/k/v are a few hundred bytes
against the state tile). Not yet timed on a GPU: bench/bench_gated_delta.py --sweep times BV x
warps through the JIT.

Stdlib only: the build and the loader import this without torch or triton.
"""
from __future__ import annotations

from aotc.kernels.variants import Arg, KernelSpec, LaunchConfig

DTYPES = ("fp16", "bf16", "fp32")
K_DIMS = (64, 128, 256)  # the K tiles built; K itself is any size up to MAX_K
LAYOUTS = ("vmajor", "kmajor")
MAX_T = 8  # tokens a request per decode call (speculative verify); more is prefill's job
MAX_K, MAX_V = 256, 512
GATE_CODES = {"fp32": 0, "fp16": 1, "bf16": 2}  # the kernel's runtime dtype codes of gate tensors

_ALIGNED_PTRS = ("Q", "K", "V", "Out", "State")
_GATE_PTRS = ("G", "Beta", "A_log", "Dt_bias")
_COUNTS = ("T", "HV", "group", "num_slots")
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
    + (Arg("State", "ptr", aligned=True, dtype="=fp32"),)
    + tuple(Arg(n, "ptr", dtype="=u8") for n in _GATE_PTRS)
    + (Arg("Idx", "ptr", dtype="=i32"),)
    + (Arg("scale", "fp32"),)
    + tuple(Arg(n, "i32") for n in _COUNTS)
    + tuple(Arg(n, "i32", aligned=True) for n in _ALIGNED_INTS)
    + tuple(Arg(n, "i32") for n in _GATE_INTS)
)

CONSTEXPRS = ("BK", "BV", "KMAJOR")


def block_k(k: int) -> int:
    """The K tile (the `k_dim` axis) serving head size k <= MAX_K: the smallest built one >= k."""
    return next(t for t in K_DIMS if t >= k)


def block_v(k_dim: int, layout: str) -> int:
    """Value rows a program (see the module docstring)."""
    return 32 if layout == "kmajor" else 1024 // k_dim


def constexprs(axes) -> dict:
    k = int(axes["k_dim"])
    return {"BK": k, "BV": block_v(k, axes["layout"]), "KMAJOR": int(axes["layout"] == "kmajor")}


def variants():
    for dtype in DTYPES:
        for k in K_DIMS:
            for layout in LAYOUTS:
                yield {"dtype": dtype, "k_dim": k, "layout": layout}


def launch(axes, arch: int) -> LaunchConfig:
    k = int(axes["k_dim"])
    return LaunchConfig(num_warps=block_v(k, axes["layout"]) * k // 1024, num_stages=1)  # 32 floats a thread


def axes_for(dtype: str, k_dim: int, layout: str) -> dict:
    return {"dtype": dtype, "k_dim": k_dim, "layout": layout}


def grid(batch: int, hv: int, v_dim: int, bv: int) -> tuple[int, int, int]:
    """(B * HV * cdiv(V, BV), 1, 1): no length in it."""
    return (batch * hv * (-(-v_dim // bv)), 1, 1)


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
