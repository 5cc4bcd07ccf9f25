"""MLA kernel tests run the Triton interpreter (TRITON_INTERPRET is set before triton is imported)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from aotc.loader.interpreter import patch_interpreter  # noqa: E402

patch_interpreter()
