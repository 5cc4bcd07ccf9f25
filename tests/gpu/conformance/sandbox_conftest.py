"""conftest.py of the conformance sandbox (vllm_runner.py copies it there): registers vLLM's test
markers, skips `optional` tests as vLLM's CI does without --optional (AOTC_CONFORMANCE_OPTIONAL=1 runs
them), keeps every Nth case of each
test function (AOTC_CONFORMANCE_SAMPLE, default 1: all) and appends one JSON line per finished case
to AOTC_CONFORMANCE_LOG: nodeid, outcome, and for failures the exception's last line. With
AOTC_CONFORMANCE_GPUS=N each xdist worker sees one of N GPUs (worker gwK: GPU K mod N), set before
the test module imports torch: on one GPU more workers did not run test_prefix_prefill.py faster."""
import json
import os

import pytest

_GPUS = int(os.environ.get("AOTC_CONFORMANCE_GPUS", "0"))
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _GPUS > 0 and _WORKER.startswith("gw"):
    os.environ["CUDA_VISIBLE_DEVICES"] = str(int(_WORKER[2:]) % _GPUS)


def pytest_configure(config):
    for name in ("optional", "skip_global_cleanup", "skip_v1", "cpu_model", "core_model"):
        config.addinivalue_line("markers", f"{name}: vLLM test marker")


def pytest_collection_modifyitems(config, items):
    sample = int(os.environ.get("AOTC_CONFORMANCE_SAMPLE", "1"))
    seen: dict[str, int] = {}
    keep = []
    for item in items:
        func = item.originalname if hasattr(item, "originalname") else item.name
        i = seen.get(func, 0)
        seen[func] = i + 1
        if i % sample == 0:
            keep.append(item)
        if "optional" in item.keywords and os.environ.get("AOTC_CONFORMANCE_OPTIONAL", "0") != "1":
            item.add_marker(pytest.mark.skip(reason="optional (vLLM runs these only with --optional)"))
    items[:] = keep


def _reason(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message.strip().splitlines()[0][:300] if crash.message.strip() else ""
    if isinstance(report.longrepr, tuple):  # skips: (file, line, reason)
        return str(report.longrepr[2])[:300]
    return str(report.longrepr).strip().splitlines()[-1][:300] if report.longrepr else ""


def pytest_runtest_logreport(report):
    log = os.environ.get("AOTC_CONFORMANCE_LOG")
    if not log:
        return
    if report.when == "call" or report.outcome != "passed":
        if report.when != "call" and report.outcome == "passed":
            return
        outcome = report.outcome
        if report.when != "call" and report.outcome == "failed":
            outcome = "error"
        row = {"nodeid": report.nodeid, "outcome": outcome, "when": report.when,
               "reason": "" if outcome == "passed" else _reason(report), "seconds": round(report.duration, 3)}
        with open(log, "a") as f:
            f.write(json.dumps(row) + "\n")
