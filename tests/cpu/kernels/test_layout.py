"""The kernels/ layout rule: a family imports only kernels/common/, kernels/variants.py, its own
modules and third-party packages; common/ imports no family. Read from the files (ast)."""
import ast
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[3] / "kernels"
SHARED = ("aotc.kernels.common", "aotc.kernels.variants")
FAMILIES = sorted(p.name for p in KERNELS.iterdir() if (p / "__init__.py").is_file() and p.name != "common")


def _imports(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in `path`, a module of `package` (dotted)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module
            # `from pkg import name` may name a module: judge pkg.name
            out += [(node.lineno, f"{base}.{a.name}" if not node.module or base in ("aotc", "aotc.kernels") else base)
                    for a in node.names]
    return out


def _allowed(module: str, own: str) -> bool:
    if not module.startswith("aotc."):
        return True  # stdlib, triton, torch
    return module == own or module.startswith(own + ".") or any(
        module == s or module.startswith(s + ".") for s in SHARED)


@pytest.mark.parametrize("family", FAMILIES + ["common"])
def test_a_family_imports_only_common_variants_and_itself(family):
    own = f"aotc.kernels.{family}"
    files = sorted((KERNELS / family).rglob("*.py"))
    assert files
    bad = [f"{path.relative_to(KERNELS)}:{line} imports {module}"
           for path in files for line, module in _imports(path, own)
           if not _allowed(module, own) or (family == "common" and module.startswith("aotc.kernels.")
                                           and not module.startswith(SHARED))]
    assert not bad, "\n".join(bad)


def test_the_rule_catches_a_borrowed_name(tmp_path):
    fam = tmp_path / "fam"
    fam.mkdir()
    (fam / "kernel.py").write_text("from aotc.kernels.decode.spec import GROUP_RUN\nfrom ..decode import kernel\n"
                                   "from aotc.kernels import schedule\nfrom .spec import X\n"
                                   "from ..common.dequant import _expand\nimport triton\n")
    found = [m for _, m in _imports(fam / "kernel.py", "aotc.kernels.fam")]
    assert found == ["aotc.kernels.decode.spec", "aotc.kernels.decode", "aotc.kernels.schedule",
                     "aotc.kernels.fam.spec", "aotc.kernels.common.dequant", "triton"]
    assert [m for m in found if not _allowed(m, "aotc.kernels.fam")] == found[:3]
