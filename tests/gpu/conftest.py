"""GPU tests: marked `gpu`, skipped cleanly where torch sees no CUDA device (CI).

They use the artifacts the loader finds by default (run `aotc build --arch sm90` first;
bench/device.sh does), and never TRITON_INTERPRET.
"""
import os
from pathlib import Path

import pytest
import torch

# The full tier: tests (or cases of a sweep) the quick tier, `pytest tests/gpu -m "not full"`, leaves
# out: every-variant JIT compiles, compute-sanitizer runs, the soak, and the long sweeps past a first
# case. A value None marks every case; a function of the case's parameters marks those it accepts.
# tests/cpu/test_gpu_tiers.py checks that each name here is a test in tests/gpu.
FULL = {
    "test_aot_runtime.py::test_every_built_decode_variant_matches_the_jit_bit_for_bit": None,
    "test_prefix_prefill.py::test_every_built_variant_matches_the_jit_bit_for_bit": None,
    "test_prefix_prefill.py::test_no_out_of_bounds_access_under_memcheck": None,
    "test_gated_delta.py::test_no_out_of_bounds_access_under_memcheck": None,
    "test_gated_delta_prefill.py::test_no_out_of_bounds_access_under_memcheck": None,
    "test_soak.py::test_threads_on_shared_streams_match_the_single_threaded_run_without_growth": None,
    "test_decode.py::test_formats_long_context_batch_32": lambda p: p["page_size"] != 16,
    "test_decode.py::test_quant_groups_at_length": lambda p: p["fmt"] != "int4",
    "test_prefix_prefill.py::test_int_cache_issue_configurations":
        lambda p: (p["head_dim"], p["block_size"], p["q_heads"]) != (128, 32, 16),
    "test_prefix_prefill.py::test_padded_head_sizes_and_vllm_x": lambda p: p["head_dim"] not in (24, 192),
    "test_gated_delta_prefill.py::test_aot_equals_jit_bit_for_bit": lambda p: p["bv"] != 32,
}


def _full(item) -> bool:
    rule = FULL.get(f"{Path(str(item.fspath)).name}::{getattr(item, 'originalname', item.name)}", False)
    if rule is None or rule is False:
        return rule is None
    return rule(item.callspec.params)


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    # The CPU tests' conftest turns on Triton's interpreter for the whole process; GPU tests
    # need real compiles, so on a GPU machine they run in a process of their own.
    interpreting = os.environ.get("TRITON_INTERPRET", "") not in ("", "0")
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if _full(item):
                item.add_marker(pytest.mark.full)
            if not torch.cuda.is_available():
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
            elif interpreting:
                item.add_marker(pytest.mark.skip(reason="TRITON_INTERPRET is on (the CPU tests set it): "
                                                        "run `python -m pytest tests/gpu` on its own"))
