"""Schema 2 of manifest.json: one table per kernel, so the loader parses little and builds only
the entries it asks for. Plain dicts in and out (`dataclasses.asdict(Entry)` form); manifest.py
turns them into `Entry` objects and wraps a ValueError into a ManifestError naming the file.

    {"schema_version": 2, "launch_abi": 1, "target": {...}, "aotc_version": "0.1.0", "triton_version": "3.6.0",
     "defaults": {"num_ctas": 1, "cluster_dims": [1, 1, 1], "shared": 0, ...},
     "signatures": [["*fp32", "*bf16", "i32", ...], ...],      distinct Entry.params lists
     "divisible_sets": [[], ["Q", "K", ...], ...],             distinct Entry.divisible lists
     "kernels": {"decode_merge": {
        "common": {"symbol": "decode_merge_kernel", "param_names": [...], "num_stages": 1,
                   "provenance.source_sha256": "c34b...", ...},
        "columns": ["sha256", "size", "signature", "divisible_set", "num_warps", "shared", "constexprs.BLOCK_D",
                    "constexprs.HEAD_DIM", "provenance.build_hash", "provenance.triton_hash"],
        "entries": {"decode_merge(head_dim=128,out=bf16)@aligned":
                    ["f8e6...", 12408, 0, 0, 4, 2048, 128, 128, "dbc5...", "b8b3..."], ...}}, ...}}

An entry's field is its row's value (named by the kernel's "columns"), else the kernel's "common"
value (equal for all its entries), else "defaults" (launch fields only). Stored names are Entry's
fields, except: "signature" and "divisible_set" index the top-level tables (for params and
divisible); "constexprs.NAME" / "provenance.NAME" is one item of that dict (a kernel whose entries
do not all have the same names stores the whole dict under "constexprs" / "provenance"); "path" is
left out when it is "bin/<sha256>.cubin"; "kernel" and "key" are the table's and the row's names.

Rows rather than one object per entry: json.loads allocates every object key again. For the
280-entry sm90 build, side by side on the 2-core CPU machine: schema 1 (469 KB) parsed in 1.9 ms,
these tables with an object per entry (151 KB) in 0.47 ms, with rows (92 KB) in 0.21 ms.
Timed with bench/manifest_parse.py (read_manifest + two gets), which left bench/ in issue 21 (git history).
"""
from __future__ import annotations

from operator import itemgetter

# Launch fields written out only where an entry differs (the writer also puts these in the file).
DEFAULTS = {"num_ctas": 1, "cluster_dims": [1, 1, 1], "shared": 0, "global_scratch_size": 0,
            "global_scratch_align": 1, "profile_scratch_size": 0, "profile_scratch_align": 1,
            "launch_cooperative_grid": False, "launch_pdl": False}
# Entry field -> (top-level table of its distinct values, the stored index's name).
TABLES = {"params": ("signatures", "signature"), "divisible": ("divisible_sets", "divisible_set")}
_INDEXES = {stored: (table, field) for field, (table, stored) in TABLES.items()}
GROUPS = ("constexprs", "provenance")  # dict fields stored one item per name
# Column order, for a reader's eyes: the binary, what the launch needs, then constexprs and provenance.
_ORDER = ("path", "sha256", "size", "symbol", "param_names", "signature", "divisible_set", "num_warps",
          "num_stages", "num_ctas", "cluster_dims", "shared", "global_scratch_size", "global_scratch_align",
          "profile_scratch_size", "profile_scratch_align", "launch_cooperative_grid", "launch_pdl") + GROUPS


def default_path(sha256) -> str:
    return f"bin/{sha256}.cubin"


def encode(entries: list[dict]) -> dict:
    """Entry dicts -> the document's "defaults", tables and "kernels" parts."""
    tables: dict[str, list] = {table: [] for table, _ in TABLES.values()}
    groups: dict[str, list[dict]] = {}
    for e in entries:
        groups.setdefault(e["kernel"], []).append(e)
    kernels = {}
    for kernel, group in sorted(groups.items()):
        split = [g for g in GROUPS if len({tuple(sorted(e[g])) for e in group}) == 1]
        kernels[kernel] = _kernel_table({e["key"]: _stored(e, split, tables) for e in group})
    return {"defaults": dict(DEFAULTS), **tables, "kernels": kernels}


def _stored(entry: dict, split: list[str], tables: dict[str, list]) -> dict:
    out = {}
    for name, value in entry.items():
        value = list(value) if isinstance(value, tuple) else value  # as JSON will read it back
        if name in ("kernel", "key"):
            continue
        if name in TABLES:
            table, stored = TABLES[name]
            if value not in tables[table]:
                tables[table].append(value)
            out[stored] = tables[table].index(value)
        elif name in split:
            out.update((f"{name}.{k}", v) for k, v in value.items())
        else:
            out[name] = value
    return out


def _kernel_table(stored: dict[str, dict]) -> dict:
    """Fields equal for all (2 or more) entries go to "common", the rest to columns; defaults go."""
    rows = list(stored.values())
    if all(r["path"] == default_path(r["sha256"]) for r in rows):
        for r in rows:
            del r["path"]
    common, columns = {}, []
    for name in sorted(rows[0], key=_rank):
        first = rows[0][name]
        same = all(r[name] == first for r in rows)
        if same and name in DEFAULTS and first == DEFAULTS[name]:
            continue
        if same and len(rows) > 1:
            common[name] = first
        else:
            columns.append(name)
    return {"common": common, "columns": columns,
            "entries": {key: [r[c] for c in columns] for key, r in stored.items()}}


def _rank(name: str) -> tuple:
    group = name.split(".")[0]
    return (_ORDER.index(group) if group in _ORDER else len(_ORDER), name)


class KernelTables:
    """A schema-2 document's entries, normalized and checked up front: each kernel table's field
    names (unique, known, each either common or a column, never both), its rows' lengths, keys and
    indexes. `fields` assembles an entry from that one view only, so what is checked is what is
    used; the assembled values are checked by `entry_problem` when the entry is built."""

    def __init__(self, doc: dict):
        self.defaults = _get(doc, "defaults", dict, "the manifest")
        if self.defaults.keys() - DEFAULTS.keys():  # a default path or index would dodge the checks
            raise ValueError(f"defaults may name only {sorted(DEFAULTS)}, not "
                             f"{', '.join(sorted(map(repr, self.defaults.keys() - DEFAULTS.keys())))}")
        self.tables = {t: _get(doc, t, list, "the manifest") for t, _ in TABLES.values()}
        for name, table in self.tables.items():
            if set(map(type, table)) - {list}:
                raise ValueError(f"{name} must hold only lists")
        kernels = _get(doc, "kernels", dict, "the manifest")
        self.kernels: dict[str, _Table] = {}
        self.where: dict[str, str] = {}  # key -> kernel
        for name, table in kernels.items():
            t = self.kernels[name] = _Table(name, table, self.tables)
            twice = self.where.keys() & t.rows.keys()
            if twice:
                key = min(twice)
                raise ValueError(f"entry {key} is listed under kernel {self.where[key]} and kernel {name}")
            self.where.update(dict.fromkeys(t.rows, name))

    def fields(self, key: str) -> dict | None:
        """The `Entry(**fields)` of `key`, or None when the manifest has no such entry."""
        kernel = self.where.get(key)
        if kernel is None:
            return None
        table = self.kernels[kernel]
        # common and columns are disjoint (checked): no name is looked up in two places
        stored = {**self.defaults, **table.common, **dict(zip(table.columns, table.rows[key]))}
        out: dict = {group: {} for group in GROUPS}
        for name, value in stored.items():
            group, _, item = name.partition(".")
            if item:
                out[group][item] = _copy(value)
            elif name in _INDEXES:
                table_name, field = _INDEXES[name]
                out[field] = list(self.tables[table_name][value])
            else:
                out[name] = _copy(value)
        out.setdefault("path", default_path(out.get("sha256")))
        out.update(kernel=kernel, key=key)
        return out


def _copy(value):
    """A fresh list or dict per Entry: the parsed document's "common" values are shared."""
    return list(value) if isinstance(value, list) else dict(value) if isinstance(value, dict) else value


def _get(doc: dict, name: str, kind: type, where: str):
    value = doc.get(name)
    if not isinstance(value, kind):
        raise ValueError(f"{where} has no {kind.__name__} {name!r}")
    return value


MAX_NAME = 1024  # characters of a kernel name, an entry key, a field name or a path


def text_problem(v, limit: int = MAX_NAME) -> str | None:
    """Why `v` cannot be a name this loader prints, compares and opens (kernel, key, field, path):
    not a string, empty or longer than `limit`, or holding a control character, a NUL or a lone
    surrogate (str.isprintable is False for each: such a name crashes `print` and `open`)."""
    if type(v) is not str:
        return f"not a string: {v!r}"
    if not v or len(v) > limit:
        return f"{len(v)} characters, not 1..{limit}: {v[:40]!r}"
    if not v.isprintable():
        return f"unprintable characters (control, NUL or a lone surrogate): {v[:80]!r}"
    return None


def path_problem(v) -> str | None:
    """Why `v` cannot be a binary's path inside its target folder: text_problem's, absolute, an
    empty, "." or ".." component, or a component over 255 bytes (the filesystems' NAME_MAX)."""
    why = text_problem(v)
    if why:
        return why
    parts = v.split("/")
    if v.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return f"outside its folder: {v!r}"
    if any(len(p.encode()) > 255 for p in parts):
        return f"a component over 255 bytes: {v[:40]!r}..."
    return None


def _field_name_problem(name) -> str | None:
    """Why `name` is not a stored field name (STORED, or "constexprs.X" / "provenance.X")."""
    why = text_problem(name)
    if why:
        return why
    group, dot, item = name.partition(".")
    if dot and group in GROUPS and item:
        return None
    return None if name in STORED else f"not a field of an entry: {name!r}"


class _Table:
    """One kernel's table, normalized: `common` (name -> value), `columns` (names, unique, none of
    them common) and `rows` (key -> one value per column). Refuses a table whose rows do not fit
    its columns, whose names are unknown, doubled or both common and a column, whose keys are not
    printable names, whose indexes miss their table or whose paths leave the target folder. Whole
    columns at once through map (0.06 ms for 280 entries; a Python loop per row took 0.2 ms);
    `holder` only names a culprit."""

    __slots__ = ("common", "columns", "rows")

    def __init__(self, name, table, tables: dict[str, list]):
        why = text_problem(name)
        if why:
            raise ValueError(f"kernel name {why}")
        where = f"kernel {name}"
        if not isinstance(table, dict):
            raise ValueError(f"{where}: expected an object")
        if table.keys() - {"common", "columns", "entries"}:
            extra = ", ".join(sorted(map(repr, table.keys() - {"common", "columns", "entries"})))
            raise ValueError(f"{where}: unknown table fields {extra} (a table has common, columns and entries)")
        common, columns, rows = (_get(table, n, t, where) for n, t in (("common", dict), ("columns", list),
                                                                         ("entries", dict)))
        for kind, names in (("common field", common), ("column", columns)):
            for n in names:
                why = None if type(n) is str and n in STORED else _field_name_problem(n)  # the common case first
                if why:
                    raise ValueError(f"{where}: {kind} name {why}")
        if len(set(columns)) != len(columns):
            twice = next(c for i, c in enumerate(columns) if c in columns[:i])
            raise ValueError(f"{where}: column {twice!r} is listed twice")
        both = common.keys() & set(columns)
        if both:
            raise ValueError(f"{where}: field {min(both)!r} is both common and a column; it must be one or the other")
        names = set(common) | set(columns)
        for group in GROUPS:
            if group in names and any(n.startswith(group + ".") for n in names):
                raise ValueError(f"{where}: {group!r} is stored both whole and one item per name")
        # JSON keys are strings: printable and 1..MAX_NAME long, whole column through map
        lengths = set(map(len, rows))
        if not all(map(str.isprintable, rows)) or (lengths and not 0 < min(lengths) <= max(lengths) <= MAX_NAME):
            raise ValueError(f"{where}: entry key {next(filter(None, map(text_problem, rows)))}")
        if set(map(type, rows.values())) - {list} or set(map(len, rows.values())) - {len(columns)}:
            key = next(k for k, r in rows.items() if type(r) is not list or len(r) != len(columns))
            raise ValueError(f"{where}: entry {key} does not have one value per column ({len(columns)})")
        self.common, self.columns, self.rows = common, columns, rows
        for stored, (table_name, _) in _INDEXES.items():
            values, size = self.column(stored), len(tables[table_name])
            bad = (_first(values, lambda v: type(v) is not int, {int})
                   or _first(set(values), lambda v: not 0 <= v < size))
            if bad:
                raise ValueError(f"{where}: entry {self.holder(stored, bad[0])} has {stored} "
                                 f"{bad[0]!r}, not an index into {table_name} ({size} lists)")
        field = "path" if "path" in names else "sha256"
        values = self.column(field)
        bad = _first(values, lambda v: type(v) is not str, {str})
        if bad:
            raise ValueError(f"{where}: entry {self.holder(field, bad[0])} has a {field} that is not a string: "
                             f"{bad[0]!r:.80}")
        if field == "path":
            bad = _first(values, path_problem)
        elif "/" in "".join(values):  # bin/<sha256>.cubin leaves bin/ only through a "/" in the sha256
            bad = _first(values, lambda v: "/" in v)
        if bad:
            path = bad[0] if field == "path" else default_path(bad[0])
            raise ValueError(f"{where}: entry {self.holder(field, bad[0])} has a path {path_problem(path)}")

    def column(self, name: str) -> list:
        """Every entry's stored value of `name` (one value when it is common), in row order."""
        if name in self.common:
            return [self.common[name]] if self.rows else []
        if name in self.columns:
            return list(map(itemgetter(self.columns.index(name)), self.rows.values()))
        return []

    def holder(self, name: str, value) -> str:
        """A key whose stored `name` is `value`, for an error message."""
        if name in self.common:
            return next(iter(self.rows), "(none)")
        i = self.columns.index(name)
        return next(k for k, r in self.rows.items() if type(r[i]) is type(value) and r[i] == value)  # 1.0 == 1


def _first(values, wrong, types: set | None = None) -> tuple | None:
    """(the first value for which `wrong` is true,) or None; when every value's type is in `types`
    none is wrong, and a set of types is cheaper than a call per value."""
    if types is not None and not set(map(type, values)) - types:
        return None
    return next(((v,) for v in values if wrong(v)), None)


# What an entry's launch fields may hold. The loader hands these to the driver (block size, shared
# memory, scratch allocations sized programs x bytes), so a value outside them is refused when its
# entry is built, before any binary is read or loaded (tests/cpu/reliability/test_hostile_artifacts.py).
SCALAR_PARAMS = ("i32", "u32", "fp32", "i64", "u64")  # launch._SLOT_FORMAT's keys (a test keeps them equal)
MAX_SHARED = 1 << 20  # bytes of shared memory a block: no GPU has more than 228 KB
MAX_SCRATCH = 1 << 30  # bytes of scratch a program
MAX_BINARY = 1 << 30  # bytes of one binary
_HEX = frozenset("0123456789abcdef")


def _int(lo: int, hi: int, power_of_two: bool = False):
    def check(v):
        if type(v) is not int:
            return f"not an integer: {v!r}"
        if not lo <= v <= hi or (power_of_two and v & (v - 1)):
            return f"{v} outside {lo}..{hi}" + (" or not a power of two" if power_of_two else "")
        return None
    return check


def _kind(kind: type):
    return lambda v: None if type(v) is kind else f"not a {kind.__name__}: {v!r}"


def _symbol(v):
    if type(v) is not str or not v or len(v) > 1024 or not (v[0].isalpha() or v[0] == "_") \
            or not all(c.isalnum() or c in "_.$" for c in v) or not v.isascii():
        return f"not a symbol name: {v!r}"
    return None


def _sha256(v):
    return None if type(v) is str and len(v) == 64 and set(v) <= _HEX else f"not 64 lowercase hex digits: {v!r}"


def _str_list(v):
    return None if type(v) is list and all(type(s) is str and s for s in v) else f"not a list of names: {v!r}"


def _params(v):
    bad = _str_list(v)
    if bad:
        return bad
    wrong = [p for p in v if not (p in SCALAR_PARAMS or (p[0] == "*" and p[1:].isidentifier()))]
    return f"unknown parameter types {wrong}" if wrong else None


def _cluster(v):
    if type(v) is not list or len(v) != 3 or any(type(d) is not int or not 1 <= d <= 16 for d in v):
        return f"not three integers 1..16: {v!r}"
    return None


_FIELD_CHECKS = {  # "path" first: a default path is made from the sha256
    "path": path_problem, "sha256": _sha256, "size": _int(1, MAX_BINARY), "symbol": _symbol,
    "params": _params, "param_names": _str_list, "divisible": _str_list,
    "num_warps": _int(1, 32, power_of_two=True), "num_stages": _int(0, 64), "num_ctas": _int(1, 16),
    "cluster_dims": _cluster, "shared": _int(0, MAX_SHARED),
    "global_scratch_size": _int(0, MAX_SCRATCH), "global_scratch_align": _int(1, 4096, power_of_two=True),
    "profile_scratch_size": _int(0, MAX_SCRATCH), "profile_scratch_align": _int(1, 4096, power_of_two=True),
    "launch_cooperative_grid": _kind(bool), "launch_pdl": _kind(bool),
    "constexprs": _kind(dict), "provenance": _kind(dict),
}


# Names a kernel table may store: Entry's fields (but kernel and key, the table's and the row's
# names), with params and divisible as their indexes (a test keeps this equal to Entry's fields).
STORED = frozenset(_FIELD_CHECKS.keys() - TABLES.keys()) | frozenset(_INDEXES)


def entry_problem(fields: dict) -> str | None:
    """Why an entry's assembled fields cannot be launched (the first field found wrong), or None.
    Fields that are absent are left to Entry(**fields), which names them."""
    for name, check in _FIELD_CHECKS.items():
        if name in fields:
            why = check(fields[name])
            if why:
                return f"{name} {why}"
    params, names = fields.get("params"), fields.get("param_names")
    if type(params) is list and type(names) is list and len(params) != len(names):
        return f"{len(params)} params but {len(names)} param_names"
    if type(names) is list and type(fields.get("divisible")) is list:
        unknown = sorted(set(fields["divisible"]) - set(names))
        if unknown:
            return f"divisible names {unknown}, which are not parameters"
    return None
