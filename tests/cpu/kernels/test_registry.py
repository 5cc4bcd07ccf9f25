"""The family registry: built-in spec modules plus the ones AOTC_EXTRA_SPECS names."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from aotc.aot.cli import cli
from aotc.kernels import registry


@pytest.fixture
def extra(monkeypatch):
    def set_extra(value):
        monkeypatch.setenv(registry.ENV_EXTRA, value)
        registry._load.cache_clear()
    yield set_extra
    registry._load.cache_clear()


@pytest.mark.parametrize("value, why", [
    ("tests_nowhere.tiny.spec", "cannot be imported"),  # the parent package is missing
    ("aotc.kernels.nowhere_spec", "cannot be imported"),  # the module itself is missing
    ("json", "defines no KERNELS list"),  # imports, declares nothing
])
def test_an_extra_module_that_cannot_serve_is_named(extra, value, why):
    extra(value)
    with pytest.raises(registry.SpecModuleError, match=f"AOTC_EXTRA_SPECS names '{value}', which {why}"):
        registry.all_specs()


def test_the_cli_reports_it_without_a_traceback(extra, tmp_path):
    extra("tests_nowhere.tiny.spec")
    result = CliRunner().invoke(cli, ["build", "--arch", "sm90", "--out", str(tmp_path), "--quiet"])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert "AOTC_EXTRA_SPECS names 'tests_nowhere.tiny.spec'" in result.output
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and not p.name.startswith(".")]  # nothing built


def test_builtin_families_and_an_importable_extra_load(extra):
    extra("tests.cpu.fixtures.tiny.spec")
    names = set(registry.all_specs())
    assert "tiny_axpy" in names and {"decode_split", "decode_merge", "prefix_prefill"} <= names
