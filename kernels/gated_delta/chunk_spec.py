"""Variants of the chunked gated delta rule: GDN's precompute and the state pass (`chunk.py`), KDA's
precompute (`kda_chunk.py`: kda_chunk_intra, kda_chunk_inter, kda_chunk_wy).

Axes: `dtype` (q/k/v, output and workspace: fp16, bf16, fp32), `head_k`, `head_v` (the K and V
tiles: 64, 128, 256; built where they are equal, the shapes models use; other pairs run through
the JIT fallback), for GDN's precompute `gate` (only "gdn" since KDA's precompute has kernels of
its own; kept in its keys), and for the state pass `bv` (value rows a program: 32, or the whole head_v where head_k,
head_v <= 128 and the inputs are 16-bit; the op picks one per call with `state_block_v`). The head
sizes K and V themselves are runtime ints up to their tiles (`head_tile`: K = 60 runs in the 64
tile, 100 in the 128 one, the rest of the tile masked); qk_l2norm, scale, GVA group, lengths and
strides are runtime values too; both state layouts share one binary (the pool is addressed by
strides).
3 x 3 = 9 GDN precompute variants, 9 kda_chunk_intra and 9 kda_chunk_inter (dtype x head_k),
9 kda_chunk_wy (dtype x head tile), each built at two specialization levels per target, and
2 x (2 + 2 + 1) + 3 = 13 state variants, built ALIGNED under gdn_chunk_state and GENERIC under
gdn_chunk_state_generic (two specs of one kernel: their launch configs differ, see
state_launch_generic).
On sm90 the op runs the ALIGNED 16-bit state variants at tiles <= 128 through state_ws_spec's Gluon
kernel instead (the same axes, arguments and grid).
"""
from __future__ import annotations

from aotc.kernels.variants import ALIGNED, GENERIC, Arg, KernelSpec, LaunchConfig

DTYPES = ("fp16", "bf16", "fp32")
HEAD_DIMS = (64, 128, 256)  # the tiles built; a head size is any value up to MAX_HEAD
MAX_HEAD = 256
CHUNK = 64  # tokens a chunk (kernel.CHUNK): the op sizes its workspace and grid with it


NARROW_BV = 32  # the state pass's narrow value tile, built for every head pair


def head_tile(d: int) -> int:
    """The tile (a `head_k` / `head_v` axis value) serving head size d <= MAX_HEAD: the smallest
    built one >= d."""
    return next(t for t in HEAD_DIMS if t >= d)


def state_block_vs(head_k: int, head_v: int, dtype: str = "bf16") -> tuple[int, ...]:
    """The value tiles (BV) built for a head pair: 32, and the whole head_v where both head dims are
    <= 128, head_v > 32 and the inputs are 16-bit. At 256 only 32: the one-stage configs
    state_launch needs there; fp32 only 32 too (its tiles take twice the shared memory)."""
    if head_k > 128 or head_v > 128 or head_v <= NARROW_BV or dtype == "fp32":
        return (NARROW_BV,)
    return (NARROW_BV, head_v)


def state_block_v(num_seqs: int, hv: int, head_k: int, head_v: int, sms: int, dtype: str = "bf16") -> int:
    """BV for a state-pass call with grid (num_seqs, hv, head_v // BV): the wide tile when it alone
    gives at least one program an SM (num_seqs * hv * (head_v // wide) >= sms), else 32.

    Shapes only (num_seqs counts padded sequences too; no length): one CUDA graph serves every
    length. H100 (132 SMs), JIT, bf16, H = 16, HV = 32, K = V = 128, V-major pool, state ms by
    (BV, num_warps, num_stages):
      1 x 8192 (num_seqs * HV = 32): BV32 w4 s2 0.277 (best at 2 stages; 3 since: state_launch),
        BV32 w8 s2 0.374, BV64 w4 s2 0.354, BV64 w8 s2 0.443, BV128 w8 s2 0.594, BV16 w4 s2 0.487.
        Here 32 * 1 < 132 -> 32.
      8 x 2048 (num_seqs * HV = 256): BV32 w4 s2 0.836, BV64 w4 s1 0.480, BV64 w4 s2 0.503,
        BV64 w8 s3 0.487, BV128 w8 s2 0.373 (best), BV128 w16 s2 0.640, BV128 w8 s1 0.452.
        Here 256 * 1 >= 132 -> 128.
    Near one program an SM BV32 wins (V / 32 times the programs for the sequential walk over
    chunks); past it the wide tile wins (each chunk's W, q, Kg tiles read once, not V / 32 times).
    Outputs and final states of every config that ran were bit-identical to BV32 w4 s2's. The
    threshold between the two shapes is not measured finer than that; BV64 at V = 64 not measured.
    """
    wide = state_block_vs(head_k, head_v, dtype)[-1]
    if wide > NARROW_BV and num_seqs * hv * (head_v // wide) >= sms:
        return wide
    return NARROW_BV


PREP_ARGS = (
    tuple(Arg(n, "ptr", aligned=True, dtype="dtype") for n in ("Q", "K", "V"))
    + (Arg("G", "ptr", dtype="=fp32"), Arg("Beta", "ptr", dtype="=fp32"))
    + tuple(Arg(n, "ptr", aligned=True, dtype="dtype") for n in ("W", "U", "Qg"))
    + (Arg("Fq", "ptr", aligned=True, dtype="=fp32"),)
    + tuple(Arg(n, "ptr", aligned=True, dtype="dtype") for n in ("Kg", "Aqk"))
    + (Arg("Decay", "ptr", aligned=True, dtype="=fp32"),
       Arg("Cu_seqlens", "ptr", dtype="=i32"), Arg("State_indices", "ptr", dtype="=i32"),
       Arg("scale", "fp32"), Arg("qk_l2norm", "i32"), Arg("num_seqs", "i32"), Arg("num_slots", "i32"),
       Arg("HV", "i32"),
       Arg("group", "i32"), Arg("K_DIM", "i32", aligned=True), Arg("V_DIM", "i32", aligned=True))
    # q/k/v token and head strides: multiples of 16 elements for contiguous tensors at these
    # head dims; the gate and beta strides are small (HV, 1) and never assumed.
    + tuple(Arg(n, "i32", aligned=True) for n in ("s_qt", "s_qh", "s_kt", "s_kh", "s_vt", "s_vh"))
    + tuple(Arg(n, "i32") for n in ("s_gt", "s_gh", "s_bt", "s_bh"))
)

STATE_ARGS = (
    tuple(Arg(n, "ptr", aligned=True, dtype="dtype") for n in ("W", "U", "Qs"))
    + (Arg("Fq", "ptr", aligned=True, dtype="=fp32"),)
    + tuple(Arg(n, "ptr", aligned=True, dtype="dtype") for n in ("Kg", "Aqk", "Out"))
    + (Arg("State", "ptr", aligned=True, dtype="=fp32"), Arg("Decay", "ptr", aligned=True, dtype="=fp32"),
       Arg("Cu_seqlens", "ptr", dtype="=i32"), Arg("State_indices", "ptr", dtype="=i32"),
       Arg("num_seqs", "i32"), Arg("num_slots", "i32"), Arg("HV", "i32"), Arg("group", "i32"),
       Arg("K_DIM", "i32", aligned=True), Arg("V_DIM", "i32", aligned=True))
    # the query rows' strides (q's or the Qg workspace's), as the output's: multiples of 16
    + tuple(Arg(n, "i32", aligned=True) for n in ("s_qt", "s_qh", "s_ot", "s_oh"))
    # pool strides: one of the last two is 1 (V-major or K-major), so none is assumed
    + tuple(Arg(n, "i32") for n in ("s_sn", "s_sh", "s_sv", "s_sk"))
)


def prep_subblocks(dtype: str, head_k: int, kda: bool) -> bool:
    """Whether the precompute writes Qg (the state pass then reads Qg, group 1, not q): always for
    KDA (kda_chunk_inter); for GDN at fp32 with the 256 tile, where gdn_chunk_prep works in 16-row
    sub-blocks (its chunk-wide [64, K] x [K, 64] dots would take 256 KiB of shared memory on sm90,
    Triton 3.6; 64 KiB this way)."""
    return kda or (dtype == "fp32" and head_k > 128)


def prep_constexprs(axes) -> dict:
    if axes["gate"] != "gdn":
        raise ValueError(f"gdn_chunk_prep: gate {axes['gate']!r}: only 'gdn' (KDA runs kda_chunk_intra, "
                         "kda_chunk_inter, kda_chunk_wy)")
    return {"HEAD_K": int(axes["head_k"]), "HEAD_V": int(axes["head_v"]),
            "SUBBLOCKS": int(prep_subblocks(axes.get("dtype", "bf16"), int(axes["head_k"]), False))}


def prep_target_constexprs(axes, arch) -> dict:
    """MERGE_TF32: the inverse's block merges in tf32 on tensor cores (CUDA; chunk._mm), exact
    fp32 elsewhere (Triton 3.6 allows tf32 dots on no AMD target but gfx942, and Iluvatar's is
    unknown)."""
    return {"MERGE_TF32": int(getattr(arch, "backend", "cuda") == "cuda")}


def state_target_constexprs(axes, arch) -> dict:
    """TF32: fp32 inputs' dots run as tf32x3 on CUDA, exact fp32 elsewhere (chunk._dot)."""
    return {"TF32": int(getattr(arch, "backend", "cuda") == "cuda")}


def state_constexprs(axes) -> dict:
    return {"HEAD_K": int(axes["head_k"]), "HEAD_V": int(axes["head_v"]), "BV": int(axes["bv"])}


def prep_variants():
    # GDN only: KDA's precompute is KDA_CHUNK_INTRA, KDA_CHUNK_INTER and KDA_CHUNK_WY
    for dtype in DTYPES:
        for d in HEAD_DIMS:
            yield {"dtype": dtype, "head_k": d, "head_v": d, "gate": "gdn"}


def state_variants():
    for dtype in DTYPES:
        for d in HEAD_DIMS:
            for bv in state_block_vs(d, d, dtype):
                yield {"dtype": dtype, "head_k": d, "head_v": d, "bv": bv}


def prep_launch(axes, arch: int) -> LaunchConfig:
    # No loop over loads to pipeline (one chunk a program): 1 stage. sm90 binaries (Triton 3.6, bf16,
    # registers / spill bytes a thread, before the cap below): K = 128 at 4 warps gdn 250 / 0, kda
    # 255 / 120 (8 warps: gdn 170 / 0, the same 8 warps an SM either way); K = 256 at 8 warps gdn
    # 221 / 0, kda 255 / 272 (16 warps, an earlier version: 64 registers, 2 KB spilled). Shared
    # memory 48 KiB (gdn; kda at 8 warps: 48 KiB) at K = 128, 96 KiB (gdn) at 256. Other warp counts:
    # bench_gated_delta_prefill.py --sweep.
    # GDN at K, V <= 128: maxnreg 168, faster than no cap or 128 (4 programs an SM) on the H100
    # (BENCHMARKS.md, Kernel choices: bf16 inverse; K = V = 64 and sm80 not measured).
    big = int(axes["head_k"]) > 128 or int(axes["head_v"]) > 128
    cap = 168 if not big and axes.get("dtype") != "fp32" else 0  # fp32: not measured
    return LaunchConfig(num_warps=8 if big else 4, num_stages=1, maxnreg=cap)


def state_launch(axes, arch: int) -> LaunchConfig:
    # Stages prefetch later chunks' W, q, Kg (16 KiB each at K = 128, bf16), U and Aqk while the
    # dots of this one run. Triton 3.6's BV 32 binaries at K = V = 128 (3 stages) take 188 KiB of
    # shared memory on sm90 and 128 KiB on sm80 (inside 227 / 163 KiB). At K = V = 256 (one
    # stage, 124 KiB) the H100 run at d62b607 found Triton 3.6's binary wrong below 16 warps: 8
    # warps read shared memory out of range (compute-sanitizer: gdn_chunk_state, thread 128+), 4
    # warps returned outputs off by 1.7e2 relative; 16 warps matched the reference
    # (tests/gpu/test_gated_delta_prefill.py).
    # So at K or V > 128 only BV 32 is declared, at 16 warps and one stage, for correctness.
    # fp32 there is the exception: its 16-warp binary faults (illegal address; the aligned and the
    # generic one, and Triton's JIT of it, on the H100) though every address the kernel forms is in
    # range (the interpreter's bounds check, tests/cpu/kernels/gated_delta/test_chunk_bounds.py);
    # 2 stages need 280 KiB of shared memory (over 227). 4 warps at one stage computed KDA fp32
    # K = V = 256 to 9e-7 of the reference there (BENCHMARKS.md, Kernel choices: head sizes and fp32).
    # BV == head_v (the wide tile, chosen by state_block_v at many sequence-heads): 8 warps, 2 stages,
    # the fastest launch measured (BENCHMARKS.md, Kernel choices: state pass launch). BV 64 at V = 64,
    # and the wide tile on sm80 (its BV128 binary: 104 KiB), not measured.
    # AMD (64 KiB of LDS a workgroup): Triton 3.6's gfx942 / gfx90a BV128 binary takes 88 KiB at 2
    # stages (it would not load) and 64 KiB at one, as BV 32's does at 2: one stage there (not timed).
    # BV 32 at one stage at K = V = 128 (4 or 8 warps) hit an illegal memory access on the H100
    # (Triton 3.6 miscompile): never declare it there (K, V = 256's 16-warp one stage matched).
    hk, hv, bv = int(axes["head_k"]), int(axes["head_v"]), int(axes["bv"])
    blocks = state_block_vs(hk, hv, axes.get("dtype", "bf16"))
    if bv not in blocks:
        raise ValueError(f"gdn_chunk_state: bv {bv} is not one of {blocks} at head_k {hk}, head_v {hv}, "
                         f"dtype {axes.get('dtype')}")
    if hk > 128 or hv > 128:
        return LaunchConfig(num_warps=4 if axes.get("dtype") == "fp32" else 16, num_stages=1)
    if axes.get("dtype") == "fp32":
        # Twice the bytes a tile: 2 stages (152 KiB of shared memory on sm90 at K = V = 128, 96 at
        # 64; inside sm80's 163 too) keep clear of the one-stage miscompile above. Not timed. AMD:
        # one stage (64 KiB of LDS), not run.
        return LaunchConfig(num_warps=4, num_stages=1 if getattr(arch, "backend", "cuda") == "hip" else 2)
    if bv == NARROW_BV:
        # 3 stages on CUDA: Triton issues a chunk's copies at the end of the iteration before the
        # one that reads them (the last dots done), so at 2 stages their latency sits in every
        # iteration; at 3 a whole iteration covers it (BENCHMARKS.md, Kernel choices: state pass
        # launch); s4 needs 248 KiB (over 227). sm80: 128 KiB (inside 163), not timed. Other
        # backends keep 2 (hip: 64 KiB of LDS at 2 already).
        return LaunchConfig(num_warps=4, num_stages=3 if getattr(arch, "backend", "cuda") == "cuda" else 2)
    return LaunchConfig(num_warps=8, num_stages=1 if getattr(arch, "backend", "cuda") == "hip" else 2)


def state_launch_generic(axes, arch: int) -> LaunchConfig:
    # The GENERIC binaries (rows not 16-byte aligned: a head size off 16 such as 100, or a strided
    # view) get no 16-byte async copies from Triton 3.6, so at 16-bit dtypes they compile as if at
    # one stage (sm90, fp16, K = V = 128, BV 32, 4 warps: 68 KiB of shared memory, 255 registers and
    # 1264 B of stack, against the aligned binary's 188 KiB / 244 / 0): the shape of the one-stage
    # 4/8-warp binaries state_launch warns about. On the H100 (Triton 3.6) fla's test_chunk at
    # K = V = 100 (fp16, the generic 128-tile binary at 4 warps) was followed by an illegal memory
    # access. So the 16-bit generic binaries take 16 warps at one stage, the config found correct at
    # 256, 128 (KDA fp16 K = 100) and 64: there state_launch's 4 warps (3 stages, and 2) computed KDA
    # and GDN at K = 60 wrong from a sequence's second chunk on (relative error 0.8), 8 warps at 2
    # stages and 16 at one right (BENCHMARKS.md, Kernel choices: head sizes and fp32).
    # fp32 keeps state_launch's: 4-byte elements still take async copies (152 KiB of shared memory
    # at 128, pipelined); its generic 64 and 128 tiles computed K = 60 and 100 right on the H100.
    if axes["dtype"] != "fp32":
        state_launch(axes, arch)  # the same declared tiles
        return LaunchConfig(num_warps=16, num_stages=1)
    return state_launch(axes, arch)


def prep_axes(dtype: str, head_k: int, head_v: int, kda: bool) -> dict:
    return {"dtype": dtype, "head_k": head_k, "head_v": head_v, "gate": "kda" if kda else "gdn"}


def state_axes(dtype: str, head_k: int, head_v: int, bv: int) -> dict:
    return {"dtype": dtype, "head_k": head_k, "head_v": head_v, "bv": bv}


GDN_CHUNK_PREP = KernelSpec(
    name="gdn_chunk_prep",
    module="aotc.kernels.gated_delta.chunk",
    function="gdn_chunk_prep",
    args=PREP_ARGS,
    constexpr_names=("HEAD_K", "HEAD_V", "SUBBLOCKS", "MERGE_TF32"),
    constexprs=prep_constexprs,
    target_constexprs=prep_target_constexprs,
    variants=prep_variants,
    launch=prep_launch,
    sources=("chunk.py",),
)

# One kernel, two specs: the ALIGNED binaries (state_launch) and the GENERIC ones
# (state_launch_generic); the op routes a call by its alignment (gated_delta_prefill.launch_plan).
_STATE_KERNEL = dict(
    module="aotc.kernels.gated_delta.chunk",
    function="gdn_chunk_state",
    args=STATE_ARGS,
    constexpr_names=("HEAD_K", "HEAD_V", "BV", "TF32"),
    constexprs=state_constexprs,
    target_constexprs=state_target_constexprs,
    variants=state_variants,
    sources=("chunk.py",),
)
GDN_CHUNK_STATE = KernelSpec(name="gdn_chunk_state", launch=state_launch, levels=(ALIGNED,), **_STATE_KERNEL)
GDN_CHUNK_STATE_GENERIC = KernelSpec(name="gdn_chunk_state_generic", launch=state_launch_generic, levels=(GENERIC,),
                                     **_STATE_KERNEL)


# KDA's precompute (kda_chunk.py): A / Aqk's diagonal blocks, the blocks below them, then the
# inverse and W / U / Qg / Kg / decay; A passes through the Akk workspace (fp32 [T, HV, 64]).
KDA_INTRA_ARGS = (
    tuple(Arg(n, "ptr", aligned=True, dtype="dtype") for n in ("Q", "K"))
    + (Arg("G", "ptr", aligned=True, dtype="=fp32"), Arg("Beta", "ptr", dtype="=fp32"),
       Arg("Aqk", "ptr", aligned=True, dtype="dtype"), Arg("Akk", "ptr", aligned=True, dtype="=fp32"),
       Arg("Cu_seqlens", "ptr", dtype="=i32"), Arg("State_indices", "ptr", dtype="=i32"),
       Arg("scale", "fp32"), Arg("qk_l2norm", "i32"), Arg("num_seqs", "i32"), Arg("num_slots", "i32"),
       Arg("HV", "i32"), Arg("group", "i32"), Arg("K_DIM", "i32", aligned=True))
    + tuple(Arg(n, "i32", aligned=True) for n in ("s_qt", "s_qh", "s_kt", "s_kh", "s_gt", "s_gh"))
    + tuple(Arg(n, "i32") for n in ("s_bt", "s_bh"))
)

KDA_INTER_ARGS = (
    tuple(Arg(n, "ptr", aligned=True, dtype="dtype") for n in ("Q", "K"))
    + (Arg("G", "ptr", dtype="=fp32"), Arg("Beta", "ptr", dtype="=fp32"))
    + tuple(Arg(n, "ptr", aligned=True, dtype="dtype") for n in ("W", "Qg"))
    + (Arg("Fq", "ptr", aligned=True, dtype="=fp32"),)
    + tuple(Arg(n, "ptr", aligned=True, dtype="dtype") for n in ("Kg", "Aqk"))
    + (Arg("Akk", "ptr", aligned=True, dtype="=fp32"), Arg("Decay", "ptr", aligned=True, dtype="=fp32"),
       Arg("Cu_seqlens", "ptr", dtype="=i32"), Arg("State_indices", "ptr", dtype="=i32"),
       Arg("scale", "fp32"), Arg("qk_l2norm", "i32"), Arg("num_seqs", "i32"), Arg("num_slots", "i32"),
       Arg("HV", "i32"), Arg("group", "i32"), Arg("K_DIM", "i32", aligned=True))
    + tuple(Arg(n, "i32", aligned=True) for n in ("s_qt", "s_qh", "s_kt", "s_kh"))
    + tuple(Arg(n, "i32") for n in ("s_gt", "s_gh", "s_bt", "s_bh"))
)

KDA_WY_ARGS = (
    (Arg("Akk", "ptr", aligned=True, dtype="=fp32"), Arg("V", "ptr", aligned=True, dtype="dtype"),
     Arg("Beta", "ptr", dtype="=fp32"))
    + tuple(Arg(n, "ptr", aligned=True, dtype="dtype") for n in ("W", "U"))
    + (Arg("Cu_seqlens", "ptr", dtype="=i32"), Arg("State_indices", "ptr", dtype="=i32"),
       Arg("num_seqs", "i32"), Arg("num_slots", "i32"), Arg("HV", "i32"),
       Arg("K_DIM", "i32", aligned=True), Arg("V_DIM", "i32", aligned=True),
       Arg("s_vt", "i32", aligned=True), Arg("s_vh", "i32", aligned=True), Arg("s_bt", "i32"), Arg("s_bh", "i32"))
)


def kda_a_variants():
    for dtype in DTYPES:
        for d in HEAD_DIMS:
            yield {"dtype": dtype, "head_k": d}


def kda_wy_variants():
    for dtype in DTYPES:
        for d in HEAD_DIMS:
            yield {"dtype": dtype, "head_k": d, "head_v": d}


def kda_a_constexprs(axes) -> dict:
    return {"HEAD_K": int(axes["head_k"])}


def kda_wy_constexprs(axes) -> dict:
    return {"HEAD_K": int(axes["head_k"]), "HEAD_V": int(axes["head_v"])}


def kda_intra_launch(axes, arch: int) -> LaunchConfig:
    # One warp a chunk (a lane two rows, kda_chunk.py), one stage. 255 registers, no spills: capping
    # them at 168 or 128 (spills), or 2 warps, was slower (BENCHMARKS.md, Kernel choices: kda_chunk_intra launch).
    return LaunchConfig(num_warps=1, num_stages=1)


def kda_inter_launch(axes, arch: int) -> LaunchConfig:
    # Twelve [16, 16] accumulators, [16, 32] operands. CUDA: 4 warps, 2 stages (the next channel
    # step's q, k, g tiles copied ahead; at 4 warps no spills), faster than 2 warps at 1, 2 or 3
    # stages on the H100 (BENCHMARKS.md, Kernel choices: kda_chunk_inter launch). Other backends keep 2 warps,
    # one stage (not measured there).
    if getattr(arch, "backend", "cuda") == "cuda":
        return LaunchConfig(num_warps=4, num_stages=2)
    return LaunchConfig(num_warps=2, num_stages=1)


def kda_wy_launch(axes, arch: int) -> LaunchConfig:
    # X [64, 64] and the chunk's W-operand and v column blocks (16-bit, loaded together) live: 4 warps
    # (8 and 2 were slower with one block live: BENCHMARKS.md, Kernel choices: kda_chunk_wy launch;
    # not re-swept since), one stage.
    return LaunchConfig(num_warps=4, num_stages=1)


def kda_a_axes(dtype: str, head_k: int) -> dict:
    return {"dtype": dtype, "head_k": head_k}


def kda_wy_axes(dtype: str, head_k: int, head_v: int) -> dict:
    return {"dtype": dtype, "head_k": head_k, "head_v": head_v}


KDA_CHUNK_INTRA = KernelSpec(
    name="kda_chunk_intra",
    module="aotc.kernels.gated_delta.kda_chunk",
    function="kda_chunk_intra",
    args=KDA_INTRA_ARGS,
    constexpr_names=("HEAD_K",),
    constexprs=kda_a_constexprs,
    variants=kda_a_variants,
    launch=kda_intra_launch,
    sources=("kda_chunk.py", "chunk.py"),
)

KDA_CHUNK_INTER = KernelSpec(
    name="kda_chunk_inter",
    module="aotc.kernels.gated_delta.kda_chunk",
    function="kda_chunk_inter",
    args=KDA_INTER_ARGS,
    constexpr_names=("HEAD_K", "TF32"),
    constexprs=kda_a_constexprs,
    target_constexprs=state_target_constexprs,
    variants=kda_a_variants,
    launch=kda_inter_launch,
    sources=("kda_chunk.py", "chunk.py"),
)

KDA_CHUNK_WY = KernelSpec(
    name="kda_chunk_wy",
    module="aotc.kernels.gated_delta.kda_chunk",
    function="kda_chunk_wy",
    args=KDA_WY_ARGS,
    constexpr_names=("HEAD_K", "HEAD_V", "MERGE_TF32"),
    constexprs=kda_wy_constexprs,
    target_constexprs=prep_target_constexprs,
    variants=kda_wy_variants,
    launch=kda_wy_launch,
    sources=("kda_chunk.py", "chunk.py"),
)

KERNELS = (GDN_CHUNK_PREP, GDN_CHUNK_STATE, GDN_CHUNK_STATE_GENERIC, KDA_CHUNK_INTRA, KDA_CHUNK_INTER, KDA_CHUNK_WY)
