"""aot/sources.py: the files behind a kernel's build hash, found through its imports.

A build is incremental on that hash, so an imported helper left out keeps stale binaries after an
edit (prefix_prefill's int8/int4 path lives in quant.py and common/dequant.py)."""
import importlib
import sys

import pytest

from aotc.aot import build as build_mod
from aotc.aot.sources import named_sources
from aotc.kernels.registry import get_spec
from aotc.kernels.variants import Arg, KernelSpec, LaunchConfig


def names(spec):
    return [name for name, _ in named_sources(spec)]


def test_builtin_kernels_hash_every_file_they_import():
    # prefix_prefill's kernels read their decorator switches from their spec module (which imports
    # the shared formats and the variant types) and share the block schedule's helper.
    shared = ["common/dequant.py", "common/formats.py", "common/schedule.py", "common/score_mod.py",
              "prefix_prefill/quant.py", "prefix_prefill/spec.py", "variants.py"]
    assert names(get_spec("prefix_prefill")) == sorted(shared + ["prefix_prefill/kernel.py"])
    # the Gluon kernel takes kernel.py's constants
    assert names(get_spec("prefix_prefill_ws")) == sorted(shared + ["prefix_prefill/kernel.py",
                                                                    "prefix_prefill/kernel_ws.py"])
    # decode's kernel reads constants from its spec module, which imports the variant types, takes
    # its split's tokens from the shared schedule and its score modifiers from common/score_mod.
    assert names(get_spec("decode_split")) == ["common/dequant.py", "common/formats.py", "common/schedule.py",
                                               "common/score_mod.py",
                                               "decode/kernel.py", "decode/spec.py", "variants.py"]
    assert names(get_spec("gdn_chunk_prep")) == ["common/schedule.py", "gated_delta/chunk.py"]


def _family(root, package):
    """A kernel family on disk: kernel.py imports helper.py (relative) and common/dequant.py."""
    pkg = root / package
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("import triton\n\n\n@triton.jit\ndef twice(x):\n    return x * 2\n")
    (pkg / "kernel.py").write_text(
        "import triton\nimport triton.language as tl\n\nfrom .helper import twice\n"
        "from aotc.kernels.common.dequant import _i8x2_codes  # noqa: F401\n\n\n@triton.jit\n"
        "def k(x, BLOCK: tl.constexpr):\n    o = tl.arange(0, BLOCK)\n    tl.store(x + o, twice(tl.load(x + o)))\n")
    return KernelSpec(name=f"{package}_k", module=f"{package}.kernel", function="k", args=(Arg("x", "ptr", dtype="=fp32"),),
                      constexpr_names=("BLOCK",), constexprs=lambda axes: {"BLOCK": 64},
                      variants=lambda: [{}], launch=lambda axes, arch: LaunchConfig(num_warps=1, num_stages=1))


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    yield tmp_path
    for m in [m for m in sys.modules if m.startswith(("fam_a", "fam_b"))]:
        del sys.modules[m]
    importlib.invalidate_caches()


def _hash(spec):
    build_mod._source_hashes.pop(spec.name, None)
    return build_mod.source_hash(spec)


def test_editing_an_imported_helper_changes_the_build_hash(on_path):
    spec = _family(on_path / "a", "fam_a")
    assert names(spec) == ["common/dequant.py", "helper.py", "kernel.py"]
    before = _hash(spec)
    helper = on_path / "a" / "fam_a" / "helper.py"
    helper.write_text(helper.read_text().replace("x * 2", "x * 3"))
    assert _hash(spec) != before


def test_the_hash_does_not_depend_on_where_the_family_sits(on_path):
    a = _family(on_path / "a", "fam_a")
    b = _family(on_path / "b" / "deeper", "fam_b")
    sys.path.insert(0, str(on_path / "b" / "deeper"))
    try:
        # Same bytes under another folder and package name: one hash (names are relative).
        assert names(a) == names(b) and _hash(a) == _hash(b)
    finally:
        sys.path.remove(str(on_path / "b" / "deeper"))
