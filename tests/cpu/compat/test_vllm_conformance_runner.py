"""The vLLM conformance runner's machinery without a GPU or vLLM's files: a fake peer folder (a
one-function kernel module and a test file written here) becomes a sandbox whose bound module
re-exports the peer's names with the entry point taken from aotc.compat.vllm; a wrong sdist is
refused by sha256; results tabulate per function with internal tests out of the totals."""
import os
import subprocess
import sys

import pytest

from tests.gpu.conformance import vllm_runner, vllm_shims


def _fake_peer(root):
    ops = root / vllm_runner.OPS_DIR
    tests = root / vllm_runner.TEST_DIR
    ops.mkdir(parents=True)
    tests.mkdir(parents=True)
    (ops / "prefix_prefill.py").write_text("HELPER = 7\n\ndef context_attention_fwd(*a, **k):\n    return 'peer'\n")
    (tests / "test_prefix_prefill.py").write_text(
        "from vllm.v1.attention.ops.prefix_prefill import HELPER, context_attention_fwd\n"
        "from vllm.v1.kv_cache_interface import KVQuantMode\n"
        "def test_bound():\n    assert HELPER == 7 and KVQuantMode.FP8_PER_TENSOR == 1\n"
        "    assert context_attention_fwd.__module__ == EXPECTED\n")
    return root


@pytest.mark.parametrize("impl,expected", [("aotc", "aotc.compat.vllm"),
                                           ("vllm", "vllm.v1.attention.ops.prefix_prefill")])
def test_sandbox_binds_the_entry_point(tmp_path, impl, expected):
    root = _fake_peer(tmp_path / "peer")
    assert vllm_runner.locate_peer(str(root), str(tmp_path / "x")) == str(root)
    sandbox = vllm_runner.build_sandbox(str(root), impl, str(tmp_path / impl))
    test = os.path.join(sandbox, "tests", "test_prefix_prefill.py")
    with open(test) as f:
        src = f.read().replace("EXPECTED", repr(expected))
    with open(test, "w") as f:
        f.write(src)
    log = str(tmp_path / f"{impl}.jsonl")
    res = vllm_runner.run_file(sandbox, "test_prefix_prefill.py", 1, 120, log)
    assert [r["outcome"] for r in res["rows"]] == ["passed"], res["output_tail"]
    for rel in vllm_shims.COMMON:
        assert os.path.exists(os.path.join(sandbox, rel))


@pytest.mark.parametrize("optional,expected", [(False, "skipped"), (True, "passed")])
def test_optional_cases_run_only_when_asked(tmp_path, optional, expected):
    root = _fake_peer(tmp_path / "peer")
    sandbox = vllm_runner.build_sandbox(str(root), "vllm", str(tmp_path / "s"))
    with open(os.path.join(sandbox, "tests", "test_prefix_prefill.py"), "w") as f:
        f.write("import pytest\n\n@pytest.mark.optional\ndef test_f32():\n    pass\n")
    res = vllm_runner.run_file(sandbox, "test_prefix_prefill.py", 1, 120, str(tmp_path / "x.jsonl"),
                               optional=optional)
    assert [r["outcome"] for r in res["rows"]] == [expected], res["output_tail"]


def test_wrong_sdist_is_refused(tmp_path):
    bad = tmp_path / "vllm-0.33.0.tar.gz"
    bad.write_bytes(b"not vllm")
    with pytest.raises(vllm_runner.PeerMissing, match="sha256"):
        vllm_runner.locate_peer(str(bad), str(tmp_path / "x"))
    with pytest.raises(vllm_runner.PeerMissing, match="no such"):
        vllm_runner.locate_peer(str(tmp_path / "missing.tar.gz"), str(tmp_path / "x"))


def test_table_totals_leave_internal_tests_out():
    rows = [{"nodeid": "tests/t.py::test_triton_unified_attn[a]", "outcome": "passed", "reason": ""},
            {"nodeid": "tests/t.py::test_triton_unified_attn[b]", "outcome": "failed",
             "reason": "NotImplementedError: x"},
            {"nodeid": "tests/t.py::test_reduce_segments_ignores_empty_softmax_states[c]", "outcome": "passed",
             "reason": ""}]
    results = {i: {"unified": {"rows": rows, "timed_out": False}} for i in ("aotc", "vllm")}
    text = vllm_runner.table(results, ("aotc", "vllm"))
    assert "| test_triton_unified_attn | 1 / 2 | 1 / 2 |" in text
    assert "(internal)" in text and "**1 / 2**" in text
    assert "1 x NotImplementedError: x" in vllm_runner.reasons(results, "aotc")


def test_cli_skips_cleanly_without_cuda_or_files(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([sys.executable, "-m", "tests.gpu.conformance.vllm_runner", "--peer", str(tmp_path / "none")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0 and res.stdout.startswith("skipped:"), res.stdout + res.stderr


def _fake_popen(monkeypatch):
    """[(cmd, env)] of every pytest process run_file starts; none is started."""
    seen = []

    class Proc:
        returncode = 0

        def __init__(self, cmd, env=None, **kw):
            seen.append((cmd, env))

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(vllm_runner.subprocess, "Popen", Proc)
    return seen


def test_workers_and_case_timeout_reach_pytest(tmp_path, monkeypatch):
    # xdist's -n and pytest-timeout's ini option go on the command only when asked for
    seen = _fake_popen(monkeypatch)
    log = str(tmp_path / "x.jsonl")
    vllm_runner.run_file(str(tmp_path), "test_x.py", 1, 10, log, workers=3, case_timeout=120)
    vllm_runner.run_file(str(tmp_path), "test_x.py", 1, 10, log)
    vllm_runner.run_file(str(tmp_path), "test_x.py", 1, 10, log, select="clamped or chunk")
    cmds = [cmd for cmd, _ in seen]
    assert cmds[0][-4:] == ["-n", "3", "-o", "timeout=120"]
    assert cmds[2][-2:] == ["-k", "clamped or chunk"] and "-k" not in cmds[0]
    assert "-n" not in cmds[1] and not any(a.startswith("timeout=") for a in cmds[1])


@pytest.mark.parametrize("gpus,worker,expected", [(4, "gw5", "1"), (4, "gw0", "0"), (0, "gw5", None), (4, "", None)])
def test_gpus_spread_workers_one_gpu_each(gpus, worker, expected):
    # the sandbox conftest sets CUDA_VISIBLE_DEVICES at import, before the test module imports torch
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "PYTEST_XDIST_WORKER")}
    env.update(AOTC_CONFORMANCE_GPUS=str(gpus), PYTEST_XDIST_WORKER=worker)
    path = os.path.join(os.path.dirname(vllm_runner.__file__), "sandbox_conftest.py")
    code = (f"import importlib.util, os; s = importlib.util.spec_from_file_location('c', {path!r}); "
            "s.loader.exec_module(importlib.util.module_from_spec(s)); print(os.environ.get('CUDA_VISIBLE_DEVICES'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(expected)


def test_gpus_reach_the_worker_environment(tmp_path, monkeypatch):
    seen = _fake_popen(monkeypatch)
    log = str(tmp_path / "x.jsonl")
    vllm_runner.run_file(str(tmp_path), "test_x.py", 1, 10, log, workers=4, gpus=4)
    vllm_runner.run_file(str(tmp_path), "test_x.py", 1, 10, log, workers=1, gpus=4)
    assert seen[0][1]["AOTC_CONFORMANCE_GPUS"] == "4" and seen[1][1]["AOTC_CONFORMANCE_GPUS"] == "0"
