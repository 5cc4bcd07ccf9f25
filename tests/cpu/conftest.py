"""CPU test setup: the interpreter for kernel numerics, the tiny fixture family for the build.

TRITON_INTERPRET must be set before anything imports triton (triton.jit reads it at decoration
time); build workers drop it again, since they compile real kernels.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
_extra = "tests.cpu.fixtures.tiny.spec"
if _extra not in os.environ.get("AOTC_EXTRA_SPECS", ""):
    os.environ["AOTC_EXTRA_SPECS"] = ",".join(x for x in (os.environ.get("AOTC_EXTRA_SPECS"), _extra) if x)
