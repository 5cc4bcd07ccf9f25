"""GPU tests: marked `gpu`, skipped cleanly where torch sees no CUDA device (CI).

They use the artifacts the loader finds by default (run `aotc build --arch sm90` first;
bench/device.sh does), and never TRITON_INTERPRET.
"""
import os

import pytest
import torch

os.environ.pop("TRITON_INTERPRET", None)


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
