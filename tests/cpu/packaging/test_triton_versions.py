"""Which Triton each part takes: `aotc build` refuses any but the supported one before compiling;
the JIT fallback takes the installed one and warns once when it is not the artifacts' builder."""
import warnings

import pytest
from click.testing import CliRunner

from aotc.aot import triton_compat
from aotc.aot.build import build
from aotc.aot.cli import cli
from aotc.kernels.registry import get_spec
from aotc.loader import dispatch, fallback, targets


@pytest.mark.parametrize("version, supported", [("3.6.0", True), ("3.6.0+git4f2a", True), ("3.6.1", False),
                                                ("3.7.0", False), ("3.5.1", False), (None, False)])
def test_the_build_supports_one_triton(version, supported):
    assert triton_compat.is_supported(version) is supported


@pytest.mark.parametrize("installed, says", [("3.7.0", "Triton 3.7.0 is installed"), (None, "Triton is not installed")])
def test_build_with_another_triton_stops_before_compiling(installed, says, monkeypatch, tmp_path):
    monkeypatch.setattr(triton_compat, "installed_triton", lambda: installed)
    out = tmp_path / "out"
    with pytest.raises(triton_compat.UnsupportedTritonError, match=says):
        build(out, ["sm90"], kernels=["tiny_axpy"], jobs=1, progress=False)
    result = CliRunner().invoke(cli, ["build", "--arch", "sm90", "--kernel", "tiny_axpy", "--out", str(out)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert says in result.output and f"with Triton {triton_compat.SUPPORTED_TRITON} only" in result.output
    assert "pip install 'aotc[build]'" in result.output  # the recipe: a build environment of its own
    assert not out.exists()  # nothing planned, nothing written


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(fallback, "_warned_versions", set())


def _version_warnings(built_with):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fallback.import_triton(get_spec("tiny_axpy"), {"block": 64, "dtype": "fp16"}, 90, built_with)
    return [str(w.message) for w in caught if issubclass(w.category, fallback.AotcJitFallbackWarning)]


def test_a_fallback_under_another_triton_than_the_builder_warns_once(fresh_warnings):
    import triton

    first = _version_warnings("3.5.1")
    assert len(first) == 1 and f"installed Triton {triton.__version__}" in first[0]
    assert "built with Triton 3.5.1" in first[0] and "not the AOT binary" in first[0]
    assert _version_warnings("3.5.1") == []  # once per pair of versions
    assert len(_version_warnings("3.4.0")) == 1


@pytest.mark.parametrize("built_with", [None, "?", "same"])
def test_no_version_warning_for_the_builder_or_without_artifacts(built_with, fresh_warnings):
    import triton

    assert _version_warnings(triton.__version__ if built_with == "same" else built_with) == []


def test_a_selection_names_its_artifacts_builder():
    class Target:
        info = targets.get("sm90")  # the table's row every TargetArtifacts carries

        class manifest:
            triton_version = "3.5.1"

    spec, axes = get_spec("tiny_axpy"), {"block": 64, "dtype": "fp16"}
    assert dispatch.Selection(spec, axes, 0, None, (9, 0)).built_with is None
    target = Target()
    target.entries = {}
    assert dispatch.Selection(spec, axes, 0, target, (9, 0)).built_with == "3.5.1"
