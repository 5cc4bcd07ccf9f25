"""Package discovery for the aotc.* namespace (metadata lives in pyproject.toml).

The repository root is the `aotc` namespace: every top-level folder holding an `__init__.py`
(kernels/, aot/, loader/, and any new one such as compat/) installs as `aotc.<folder>` with its
subpackages (kernels/gated_delta/ -> aotc.kernels.gated_delta), so adding a folder needs no
listing here. tests/ and bench/ stay out; artifacts/ holds data only (package-data in pyproject).
"""
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
found = find_packages(where=str(ROOT), exclude=["tests", "tests.*", "bench", "bench.*"])
setup(package_dir={"aotc": "."}, packages=[f"aotc.{p}" for p in found] + ["aotc.artifacts"])
