"""The compat entry points run aotc's ops on CPU tensors through the Triton interpreter."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from aotc.loader.interpreter import patch_interpreter  # noqa: E402

patch_interpreter()
