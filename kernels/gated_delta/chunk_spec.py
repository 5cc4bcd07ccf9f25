"""Variants of the chunked gated delta rule (`chunk.py`): the per-chunk precompute and the state pass.

Axes: `dtype` (q/k/v, output and workspace: fp16, bf16), `head_k`, `head_v` (64, 128, 256; built
where they are equal, the shapes models use; other pairs run through the JIT fallback), and for
the precompute `gate` ("gdn": one log-gate a head; "kda": one a head and K channel). qk_l2norm,
scale, GVA group, lengths and strides are runtime values; both state layouts share one binary
(the pool is addressed by strides). 2 x 3 x 2 = 12 precompute and 2 x 3 = 6 state variants,
each built at two specialization levels per target.
"""
from __future__ import annotations

from aotc.kernels.variants import Arg, KernelSpec, LaunchConfig

DTYPES = ("fp16", "bf16")
HEAD_DIMS = (64, 128, 256)
GATES = ("gdn", "kda")
CHUNK = 64  # tokens a chunk (kernel.CHUNK): the op sizes its workspace and grid with it


def block_v(head_v: int) -> int:
    """Values a state-pass program. 32: at B = 1, T = 8192, HV = 32, V = 128 the grid is 128
    programs, about one an SM on an H100 (64 would leave half the SMs idle on the sequential
    pass). Not measured against 64 yet (no GPU in the session that wrote it)."""
    return 32


PREP_ARGS = (
    tuple(Arg(n, "ptr", aligned=True, dtype="dtype") for n in ("Q", "K", "V"))
    + (Arg("G", "ptr", dtype="=fp32"), Arg("Beta", "ptr", dtype="=fp32"))
    + tuple(Arg(n, "ptr", aligned=True, dtype="dtype") for n in ("W", "U", "Qg", "Kg", "Aqk"))
    + (Arg("Decay", "ptr", aligned=True, dtype="=fp32"),
       Arg("Cu_seqlens", "ptr", dtype="=i32"), Arg("State_indices", "ptr", dtype="=i32"),
       Arg("scale", "fp32"), Arg("qk_l2norm", "i32"), Arg("num_seqs", "i32"), Arg("num_slots", "i32"),
       Arg("HV", "i32"),
       Arg("group", "i32"))
    # q/k/v token and head strides: multiples of 16 elements for contiguous tensors at these
    # head dims; the gate and beta strides are small (HV, 1) and never assumed.
    + tuple(Arg(n, "i32", aligned=True) for n in ("s_qt", "s_qh", "s_kt", "s_kh", "s_vt", "s_vh"))
    + tuple(Arg(n, "i32") for n in ("s_gt", "s_gh", "s_bt", "s_bh"))
)

STATE_ARGS = (
    tuple(Arg(n, "ptr", aligned=True, dtype="dtype") for n in ("W", "U", "Qg", "Kg", "Aqk", "Out"))
    + (Arg("State", "ptr", aligned=True, dtype="=fp32"), Arg("Decay", "ptr", aligned=True, dtype="=fp32"),
       Arg("Cu_seqlens", "ptr", dtype="=i32"), Arg("State_indices", "ptr", dtype="=i32"),
       Arg("num_seqs", "i32"), Arg("num_slots", "i32"), Arg("HV", "i32"))
    + tuple(Arg(n, "i32", aligned=True) for n in ("s_ot", "s_oh"))
    # pool strides: one of the last two is 1 (V-major or K-major), so none is assumed
    + tuple(Arg(n, "i32") for n in ("s_sn", "s_sh", "s_sv", "s_sk"))
)


def prep_constexprs(axes) -> dict:
    return {"HEAD_K": int(axes["head_k"]), "HEAD_V": int(axes["head_v"]), "KDA": int(axes["gate"] == "kda")}


def state_constexprs(axes) -> dict:
    return {"HEAD_K": int(axes["head_k"]), "HEAD_V": int(axes["head_v"]), "BV": block_v(int(axes["head_v"]))}


def prep_variants():
    for dtype in DTYPES:
        for d in HEAD_DIMS:
            for gate in GATES:
                yield {"dtype": dtype, "head_k": d, "head_v": d, "gate": gate}


def state_variants():
    for dtype in DTYPES:
        for d in HEAD_DIMS:
            yield {"dtype": dtype, "head_k": d, "head_v": d}


def prep_launch(axes, arch: int) -> LaunchConfig:
    # No loop over loads to pipeline (one chunk a program): 1 stage. sm90 binaries (Triton 3.6, bf16,
    # registers / spill bytes a thread): K = 128 at 4 warps gdn 250 / 0, kda 255 / 120 (8 warps: gdn
    # 170 / 0, the same 8 warps an SM either way); K = 256 at 8 warps gdn 221 / 0, kda 255 / 272 (16
    # warps, an earlier version: 64 registers, 2 KB spilled). Shared memory 48 KiB (gdn) / 32 KiB
    # (kda) at K = 128, 96 / 32 KiB at 256. Times unmeasured: bench_gated_delta_prefill.py --sweep.
    return LaunchConfig(num_warps=8 if int(axes["head_k"]) > 128 or int(axes["head_v"]) > 128 else 4,
                        num_stages=1)


def state_launch(axes, arch: int) -> LaunchConfig:
    # 2 stages prefetch the next chunk's W, Qg, Kg (16 KiB each at K = 128, bf16), U and Aqk while
    # the dots of this one run. Triton 3.6's binaries at K = V = 128 take 128 KiB of shared memory
    # on sm90 and 68 KiB on sm80 (inside 227 / 163 KiB). At K = V = 256 (one stage, 124 KiB) the
    # H100 run at d62b607 found Triton 3.6's binary wrong below 16 warps: 8 warps read shared memory
    # out of range (compute-sanitizer: gdn_chunk_state, thread 128+), 4 warps returned outputs off by
    # 1.7e2 relative; 16 warps matched the reference (tests/gpu/test_gated_delta_prefill.py).
    big = int(axes["head_k"]) > 128 or int(axes["head_v"]) > 128
    return LaunchConfig(num_warps=16 if big else 4, num_stages=1 if big else 2)


def prep_axes(dtype: str, head_k: int, head_v: int, kda: bool) -> dict:
    return {"dtype": dtype, "head_k": head_k, "head_v": head_v, "gate": "kda" if kda else "gdn"}


def state_axes(dtype: str, head_k: int, head_v: int) -> dict:
    return {"dtype": dtype, "head_k": head_k, "head_v": head_v}


GDN_CHUNK_PREP = KernelSpec(
    name="gdn_chunk_prep",
    module="aotc.kernels.gated_delta.chunk",
    function="gdn_chunk_prep",
    args=PREP_ARGS,
    constexpr_names=("HEAD_K", "HEAD_V", "KDA"),
    constexprs=prep_constexprs,
    variants=prep_variants,
    launch=prep_launch,
    sources=("chunk.py",),
)

GDN_CHUNK_STATE = KernelSpec(
    name="gdn_chunk_state",
    module="aotc.kernels.gated_delta.chunk",
    function="gdn_chunk_state",
    args=STATE_ARGS,
    constexpr_names=("HEAD_K", "HEAD_V", "BV"),
    constexprs=state_constexprs,
    variants=state_variants,
    launch=state_launch,
    sources=("chunk.py",),
)

KERNELS = (GDN_CHUNK_PREP, GDN_CHUNK_STATE)
