"""Variants of the warp-specialized Gluon state pass (`chunk_state_ws.py`), and where it serves.

The kernel takes chunk_spec.STATE_ARGS and launches on the Triton state pass's grid, so the op swaps
one for the other by the GPU alone: the same axes (dtype, head_k, head_v, bv; bv as
chunk_spec.state_block_v picks it), built for sm90 only (wgmma, setmaxnreg), 16-bit dtypes at K = V
tiles of 64 and 128, ALIGNED only (cp.async copies 16 bytes). `nc`, the consumer warpgroups that
split a program's BV columns, follows bv: 2 at BV 128 (one 64-column consumer a half, the ring
read once for the whole head), else 1 (BENCHMARKS.md, Kernel choices: Gluon state pass).
"""
from __future__ import annotations

from aotc.kernels.variants import ALIGNED, KernelSpec, sm90_gluon_launch

from . import chunk_spec

DTYPES = ("fp16", "bf16")
HEAD_DIMS = (64, 128)
ENV_WS = "AOTC_GDN_STATE_WS"  # "0": the op runs the Triton state pass on sm90 too


def ws_variant(axes) -> bool:
    """The axes chunk_state_ws.py implements."""
    return (axes["dtype"] in DTYPES and int(axes["head_k"]) == int(axes["head_v"]) in HEAD_DIMS
            and int(axes["bv"]) in chunk_spec.state_block_vs(int(axes["head_k"]), int(axes["head_v"]), axes["dtype"]))


def ws_serves(axes, capability: tuple[int, int], aligned: bool) -> bool:
    """Whether a state-pass call runs the Gluon kernel: one of its variants on an sm90 GPU (capability
    9.0, not sm100's tensor cores) with arguments that meet the ALIGNED specialization."""
    return ws_variant(axes) and tuple(capability) == (9, 0) and aligned


def consumers(bv: int) -> int:
    return 2 if bv >= 128 else 1


def ws_constexprs(axes) -> dict:
    bv = int(axes["bv"])
    return {"HEAD_K": int(axes["head_k"]), "HEAD_V": int(axes["head_v"]), "BV": bv, "NC": consumers(bv)}


def ws_variants():
    for axes in chunk_spec.state_variants():
        if ws_variant(axes):
            yield axes


ws_launch = sm90_gluon_launch(ws_variant)  # 8 warps; 16 with two consumers beside an 8-warp producer


GDN_CHUNK_STATE_WS = KernelSpec(
    name="gdn_chunk_state_ws",
    module="aotc.kernels.gated_delta.chunk_state_ws",
    function="gdn_chunk_state_ws",
    args=chunk_spec.STATE_ARGS,
    constexpr_names=("HEAD_K", "HEAD_V", "BV", "NC"),
    constexprs=ws_constexprs,
    variants=ws_variants,
    launch=ws_launch,
    sources=("chunk_state_ws.py",),
    levels=(ALIGNED,),
    kind="gluon",
)

KERNELS = (GDN_CHUNK_STATE_WS,)
