"""GPU tests: marked `gpu`, skipped cleanly where torch sees no CUDA device (CI).

They use the artifacts the loader finds by default (run `aotc build --arch sm90` first;
bench/device.sh does), and never TRITON_INTERPRET.
"""
import os

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    # The CPU tests' conftest turns on Triton's interpreter for the whole process; GPU tests
    # need real compiles, so on a GPU machine they run in a process of their own.
    interpreting = os.environ.get("TRITON_INTERPRET", "") not in ("", "0")
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
            elif interpreting:
                item.add_marker(pytest.mark.skip(reason="TRITON_INTERPRET is on (the CPU tests set it): "
                                                        "run `python -m pytest tests/gpu` on its own"))
