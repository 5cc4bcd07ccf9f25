"""Interpreter setup for the prefix-prefill CPU tests: TRITON_INTERPRET before anything imports
triton, then the NumPy >= 2.3 shim (see interp_compat.py)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from .interp_compat import install  # noqa: E402

install()
