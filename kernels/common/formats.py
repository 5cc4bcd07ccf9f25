"""The quantized cache formats every family reads: group bounds, int code ranges, and the switch
between packed inline PTX and plain Triton for their dequantization. Data only (stdlib)."""
from __future__ import annotations

MIN_QUANT_GROUP = 8  # int4 pairs channels 2i, 2i+1 in one byte and one group
MAX_QUANT_GROUP = 128
INT_QMAX = {"int8": 127, "int4": 7}  # symmetric codes: int4 stores code + 7 in a nibble


def ptx_constexprs(axes, arch) -> dict:
    """PTX: 1 on CUDA targets, where int8/int4/fp8 caches dequantize through packed inline PTX
    (common/dequant.py); elsewhere 0, the same values computed in plain Triton (its interpreter branch)."""
    return {"PTX": int(getattr(arch, "backend", "cuda") == "cuda")}
