"""Interpreter setup for the gated-delta CPU tests: TRITON_INTERPRET before anything imports
triton, then the interpreter fixes (loader/interpreter.py)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from aotc.loader.interpreter import patch_interpreter  # noqa: E402

patch_interpreter()
