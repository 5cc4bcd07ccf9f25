"""The build hash reads normalized sources (aot/sources.py): comments, docstrings and layout are
not in it, so a prose edit rebuilds nothing, and a code edit rebuilds what it touches."""
import ast
import io
import json
import os
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from aotc.aot.sources import KERNELS_ROOT, normalized_source

AOTC = KERNELS_ROOT.parent


def _reword_prose(text: str) -> str:
    """Every comment reworded, every docstring rewritten to another length (lines move), a comment
    line added after each `def`: the same code in other prose."""
    lines = text.splitlines(keepends=True)
    comments = [t for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]
    for tok in reversed(comments):
        row, col = tok.start
        line = lines[row - 1]
        lines[row - 1] = line[:col] + "# reworded" + line[tok.end[1]:]
    tree = ast.parse("".join(lines))
    docs = [n.body[0] for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)
            and isinstance(n.body[0].value.value, str)]
    for doc in sorted(docs, key=lambda d: d.lineno, reverse=True):
        indent = " " * doc.col_offset
        lines[doc.lineno - 1:doc.end_lineno] = [f'{indent}"""Reworded,\n', f"{indent}over three\n",
                                                f'{indent}lines."""\n']
    out = []
    for line in lines:
        out.append(line)
        if line.lstrip().startswith("def ") and line.rstrip().endswith(":"):
            out.append(" " * (len(line) - len(line.lstrip()) + 4) + "# a new comment line\n")
    return "".join(out)


def _files():
    return sorted(p for p in KERNELS_ROOT.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", _files(), ids=lambda p: p.relative_to(KERNELS_ROOT).as_posix())
def test_rewording_comments_and_docstrings_keeps_every_kernel_file_normalized_the_same(path, tmp_path):
    edited = tmp_path / path.name
    edited.write_text(_reword_prose(path.read_text()))
    assert edited.read_text() != path.read_text() or "#" not in path.read_text()
    assert normalized_source(edited) == normalized_source(path)


def test_code_edits_change_the_normalized_source(tmp_path):
    base = tmp_path / "a.py"
    base.write_text('"""Doc."""\nX = 1  # one\n\n\ndef f(a):\n    """Doc."""\n    return a * X\n')
    same = normalized_source(base)
    for code in ('X = 2\n\n\ndef f(a):\n    return a * X\n',              # a constant
                 'X = 1\n\n\ndef f(a):\n    return a + X\n',              # an operator
                 'X = 1\n\n\ndef f(a):\n    return a * X\n    return a\n',  # a statement
                 'X = 1\n\n\ndef f(a):\n    "not first"\n    return a * X\n    "a string"\n'):  # not a docstring
        base.write_text(code)
        assert normalized_source(base) != same, code
    base.write_text("X = 1\n\ndef f(a):\n    return (a*X)\n")  # layout only
    assert normalized_source(base) == same


# Syntax a kernel or spec file may hold. Its normalized form's digest was computed with Python 3.10,
# 3.11, 3.12 and 3.13 (all equal): a Python whose ast moves it fails here instead of rebuilding all.
SAMPLE = '''"""Module docstring."""
from __future__ import annotations
import triton
import triton.language as tl
from .spec import A as B, C  # a comment
X: int = 1 << 4
T = (1, 2.5, -3e-4, "s", b"b", None, True, ..., 1j)
@triton.jit(do_not_specialize=["n"])
def k(P, n, *rest, BLOCK: tl.constexpr = 16, **kw) -> None:
    """Docstring."""
    o = tl.arange(0, BLOCK)[:, None] * n + o[::2, 1:-1]
    if (m := o < n) and not False or n is None:
        tl.store(P + o, tl.where(m, tl.load(P + o, mask=m, other=0.0), -float("inf")), mask=m)
    for i in tl.static_range(2):
        o += i
    while n > 0:
        n -= 1
    return
class R:
    """Doc."""
    __slots__ = ()
    def f(self, a, /, b, *, c=lambda x: x ** 2):
        global X
        with open(a) as fh, open(b):
            pass
        try:
            y = {i: [j for j in range(i) if j % 2] for i in {1, 2}}
        except (KeyError, ValueError) as e:
            raise RuntimeError(f"bad {a!r:>10} {b}") from e
        finally:
            del y
        return a if b else c, {**kw}, [*rest], print(*rest, sep="")
'''
SAMPLE_DIGEST = "b753e6b2adbe8ed38a04a87c457302b0a42e708c4156f3c1c0c7d9fb1ba819a3"


def test_the_normalized_form_does_not_move_between_python_versions(tmp_path):
    import hashlib

    path = tmp_path / "sample.py"
    path.write_text(SAMPLE)
    assert hashlib.sha256(normalized_source(path)).hexdigest() == SAMPLE_DIGEST


def test_a_non_python_source_hashes_its_bytes(tmp_path):
    ptx = tmp_path / "k.ptx"
    ptx.write_bytes(b"// a comment\n.version 8.0\n")
    assert normalized_source(ptx) == ptx.read_bytes()


_HASHES = ("import json; from aotc.aot.build import source_hash; from aotc.kernels.registry import all_specs; "
           "print(json.dumps({n: source_hash(s) for n, s in all_specs().items()}))")


def _tree(tmp_path) -> Path:
    """A copy of aotc whose kernels/ may be edited: kernels/ copied, every other entry linked."""
    root = tmp_path / "site"
    pkg = root / "aotc"
    pkg.mkdir(parents=True)
    for entry in AOTC.iterdir():
        if entry.name == "kernels":
            import shutil

            shutil.copytree(entry, pkg / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
        elif not entry.name.startswith("."):
            (pkg / entry.name).symlink_to(entry)
    return root


def _source_hashes(root: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("AOTC_EXTRA_SPECS", None)
    out = subprocess.run([sys.executable, "-c", _HASHES], capture_output=True, text=True, env=env, check=True,
                         cwd=root)
    return json.loads(out.stdout)


def test_prose_edits_in_variants_and_a_spec_keep_every_build_hash_and_code_edits_change_them(tmp_path):
    root = _tree(tmp_path)
    kernels = root / "aotc" / "kernels"
    before = _source_hashes(root)
    assert set(before) >= {"decode_split", "prefix_prefill", "gated_delta_decode"}
    variants, spec = kernels / "variants.py", kernels / "decode" / "spec.py"
    for path in (variants, spec):
        path.write_text(_reword_prose(path.read_text()))
    assert _source_hashes(root) == before
    # A code edit in decode's spec reaches decode's kernels, which import it, and only those.
    text = spec.read_text()
    assert "\nMAX_SPLITS = 512" in text
    spec.write_text(text.replace("\nMAX_SPLITS = 512", "\nMAX_SPLITS = 256"))
    after = _source_hashes(root)
    assert {n for n in before if after[n] != before[n]} == {"decode_split", "decode_merge", "mla_split", "mla_merge"}
    # One in variants.py reaches the kernels whose modules import it (through their spec).
    variants.write_text(variants.read_text() + "\nEXTRA = 1\n")
    last = _source_hashes(root)
    assert {"decode_split", "decode_merge", "prefix_prefill", "prefix_prefill_ws"} <= {
        n for n in before if last[n] != after[n]}
