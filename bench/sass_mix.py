"""SASS of decode_split variants for a target, compiled on this machine (no GPU): registers, stack,
instruction count, and the opcode mix of the main loop (the longest backward branch). `--kernel`
compiles a copy of kernel.py in place of the shipped one, to compare a rewrite before timing it.

  python bench/sass_mix.py 'decode_split(cache=int4,head_dim=128,kv=int4,q=bf16,scale=bf16,scales=token,tile=narrow)@aligned'
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import re
import subprocess
import tempfile
from unittest import mock

import triton

from aotc.aot import triton_compat
from aotc.kernels.decode import spec as S
from aotc.kernels.variants import LaunchConfig, VariantKey

TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
INSTRUCTION = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH_TARGET = re.compile(r"BRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)")


def compile_cubin(key: VariantKey, arch: int, kernel_path: str, maxnreg: int = 0) -> bytes:
    if maxnreg:  # the variant's launch config with another register cap
        options = LaunchConfig.triton_options
        with mock.patch.object(LaunchConfig, "triton_options", lambda cfg: dict(options(cfg), maxnreg=maxnreg)):
            return compile_cubin(key, arch, kernel_path)
    if not kernel_path:
        return triton_compat.compile_variant(S.SPLIT, key, arch).cubin
    mod_spec = importlib.util.spec_from_file_location("decode_kernel_copy", kernel_path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    with mock.patch.object(triton_compat, "jit_function", lambda spec: mod.decode_split_kernel):
        return triton_compat.compile_variant(S.SPLIT, key, arch).cubin


def tool(name: str, cubin_path: str, flag: str) -> str:
    return subprocess.run([os.path.join(TOOLS, name), flag, cubin_path], capture_output=True, text=True,
                          check=True).stdout


def describe(cubin: bytes) -> tuple[str, collections.Counter, int]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass, usage = tool("cuobjdump", f.name, "-sass"), tool("cuobjdump", f.name, "-res-usage")
    code = [(int(m.group(1), 16), m.group(2)) for m in map(INSTRUCTION.match, sass.splitlines()) if m]
    regs = re.search(r"REG:(\d+)", usage).group(1)
    stack = re.search(r"STACK:(\d+)", usage).group(1)
    loop = None
    for addr, text in code:
        target = BRANCH_TARGET.search(text)
        if target and int(target.group(1), 16) < addr:
            start = int(target.group(1), 16)
            if loop is None or addr - start > loop[1] - loop[0]:
                loop = (start, addr)
    body = [text for addr, text in code if loop and loop[0] <= addr <= loop[1]]
    mix = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", text).split()[0] for text in body)
    return f"{len(code)} instructions, {regs} registers, stack {stack} B", mix, len(body)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("keys", nargs="*", help="decode_split variant keys (--list prints every declared one)")
    ap.add_argument("--list", action="store_true", help="print the declared decode_split variant keys")
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--kernel", default="", help="a kernel.py copy to compile in place of the shipped one")
    ap.add_argument("--maxnreg", type=int, default=0, help="compile with this register cap instead")
    ap.add_argument("--top", type=int, default=25, help="opcodes of the loop to print")
    a = ap.parse_args()
    if a.list:
        print("\n".join(str(key) for key in S.SPLIT.keys()))
    for text in a.keys:
        summary, mix, loop_len = describe(compile_cubin(VariantKey.parse(text), a.arch, a.kernel, a.maxnreg))
        print(f"{text}\n  {summary}; main loop {loop_len} instructions")
        print("  " + ", ".join(f"{op} {n}" for op, n in mix.most_common(a.top)))


if __name__ == "__main__":
    main()
