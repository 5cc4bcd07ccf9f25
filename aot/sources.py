"""The source files a kernel is made of, for the build hash: its module, the files its spec declares,
and every module it imports from its own folder or from aotc.kernels, transitively; and each
file's normalized text, the part of it that can change a binary.

Found by reading the files (ast), nothing imported. A build is incremental on this hash, so a file
left out means an edited helper keeps its stale binaries; a file hashed with its prose means a
comment edit recompiles every kernel that imports it.
"""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any

from aotc.kernels.registry import spec_folder
from aotc.kernels.variants import KernelSpec

KERNELS_ROOT = Path(importlib.util.find_spec("aotc.kernels").origin).parent


def _in_kernels(module: str) -> bool:
    return module == "aotc.kernels" or module.startswith("aotc.kernels.")


def _under_kernels(module: str) -> Path:
    """aotc.kernels.a.b -> KERNELS_ROOT/a/b (without a suffix)."""
    return KERNELS_ROOT.joinpath(*module.split(".")[2:])


def _module_file(base: Path) -> Path | None:
    """base/x.py, or the package base/x/__init__.py, for a dotted module turned into a path."""
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _imported_files(path: Path) -> set[Path]:
    """Files of the aotc.kernels modules (absolute imports) and the sibling modules (relative
    imports) that `path` imports; `from pkg import name` counts pkg/name.py where it exists."""
    found: set[Path] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            bases = [_under_kernels(a.name) for a in node.names if _in_kernels(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = path.parents[node.level - 1]
                base = anchor.joinpath(*node.module.split(".")) if node.module else anchor
            elif node.module and _in_kernels(node.module):
                base = _under_kernels(node.module)
            else:
                continue
            bases = [base] + [base / a.name for a in node.names]
        else:
            continue
        found.update(f for f in map(_module_file, bases) if f is not None)
    return found


def source_files(spec: KernelSpec) -> list[Path]:
    """Every file the kernel's compiled code can depend on, sorted, without duplicates."""
    folder = spec_folder(spec)
    start = Path(importlib.util.find_spec(spec.module).origin)
    todo = [start, *(folder / rel for rel in spec.sources)]
    seen: set[Path] = set()
    while todo:
        path = todo.pop().resolve()
        if path in seen:
            continue
        seen.add(path)
        if path.suffix == ".py":
            todo.extend(_imported_files(path))
    return sorted(seen)


def named_sources(spec: KernelSpec) -> list[tuple[str, Path]]:
    """(name in the hash, file) of every source file, sorted by name: the order, like the names,
    does not depend on where the checkout sits."""
    return sorted((source_name(path, spec), path) for path in source_files(spec))


def source_name(path: Path, spec: KernelSpec) -> str:
    """A file's name in the hash: relative to aotc.kernels (or to the spec's folder for a kernel
    outside it), so the hash does not depend on where the checkout sits."""
    for root in (KERNELS_ROOT.resolve(), spec_folder(spec).resolve()):
        if path.is_relative_to(root):
            return path.relative_to(root).as_posix()
    return path.name


def normalized_source(path: Path) -> bytes:
    """What of a source file can change a binary: a Python file's syntax tree without comments,
    docstrings or layout (so a prose edit hashes the same), any other file's raw bytes."""
    if path.suffix != ".py":
        return path.read_bytes()
    tree = ast.parse(path.read_text(), str(path))
    return _canonical(_strip_docstrings(tree)).encode()


_WITH_DOCSTRING = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, _WITH_DOCSTRING) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:]
    return tree


def _canonical(value: Any) -> str:
    """A syntax tree as text that does not move between Python 3.10 and 3.13: fields by name,
    sorted, with empty and None ones left out (newer versions add empty fields, e.g. 3.12's
    type_params, and ast.dump's form changed in 3.13); positions are not fields, so not in it."""
    if isinstance(value, ast.AST):
        fields = ((name, getattr(value, name, None)) for name in sorted(value._fields))
        inner = ",".join(f"{name}={_canonical(v)}" for name, v in fields if v not in (None, []))
        return f"{type(value).__name__}({inner})"
    if isinstance(value, list):
        return "[" + ",".join(map(_canonical, value)) + "]"
    return f"{type(value).__name__}:{value!r}"
