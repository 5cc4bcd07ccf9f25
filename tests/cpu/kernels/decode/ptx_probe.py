"""Run as a script without TRITON_INTERPRET: compile decode variants for a GPU target and print,
as JSON, how many 16- and 8-byte global reads (plain or cp.async) each binary's PTX holds, and
how many grid-dependency waits the merge kernel's PTX holds."""
import json
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from aotc.kernels.decode import kernel, spec as S


def vector_reads(axes: dict, level: str, arch: int) -> dict:
    sp = S.SPLIT
    aligned = set(sp.divisible_args(level))
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(sp.args) if a.name in aligned}
    cfg = sp.launch(axes, arch)
    src = ASTSource(kernel.decode_split_kernel, sp.signature(axes), constexprs=sp.compile_constexprs(axes, arch), attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                         options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}).asm["ptx"]
    copies = re.findall(r"cp\.async\.c[ag]\.shared\.global \[[^\]]*\], \[[^\]]*\], 0x(\w+)", ptx)
    return {"v4": len(re.findall(r"ld\.global(?:\.\w+)*\.v4\.b32", ptx)) + copies.count("10"),
            "v2": len(re.findall(r"ld\.global(?:\.\w+)*\.v2\.b32", ptx)) + copies.count("8")}


def merge_grid_waits(arch: int) -> int:
    sp = S.MERGE
    axes = S.merge_axes("bf16", 128, 3)
    cfg = sp.launch(axes, arch)
    src = ASTSource(kernel.decode_merge_kernel, sp.signature(axes), constexprs=sp.compile_constexprs(axes, arch))
    ptx = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=cfg.triton_options()).asm["ptx"]
    return ptx.count("griddepcontrol.wait")


if __name__ == "__main__":
    arch = int(sys.argv[1])
    out = {}
    for q, kv, scale, level in (("bf16", "bf16", "fp32", "aligned"), ("bf16", "bf16", "fp32", "generic"),
                                ("fp16", "int8", "bf16", "aligned"), ("bf16", "fp8_e4m3", "fp32", "aligned")):
        out[f"{kv}@{level}"] = vector_reads(S.split_axes(q, kv, scale, 128, quant_group=32), level, arch)
    out["merge_grid_waits"] = merge_grid_waits(arch)
    print(json.dumps(out))
