"""`aotc build --from-misses`: read a miss log (loader/fallback.py writes it) and check every key
against the declared kernels before anything is planned; each error names the file and line."""
from __future__ import annotations

import os

from aotc.kernels.variants import VariantKey
from aotc.loader import targets
from aotc.loader.fallback import iter_misses


def read_miss_log(path: str | os.PathLike, specs: dict) -> list[tuple[VariantKey, str | None]]:
    """The log's (generic key, target) pairs, in order, without repeats. ValueError for a line
    that is not a record, names a kernel that is not declared, has other axes than the kernel's
    variants, values its spec cannot describe, or an unknown target."""
    out, seen = [], set()
    for n, key, target in iter_misses(path):
        where = f"{path}:{n}: {key}"
        spec = specs.get(key.kernel)
        if spec is None:
            raise ValueError(f"{where}: no kernel {key.kernel!r} is declared (declared: {', '.join(sorted(specs))})")
        axes = key.axis_dict
        declared = {tuple(sorted(v)) for v in spec.variants()}
        if tuple(sorted(axes)) not in declared:
            raise ValueError(f"{where}: {key.kernel}'s variants have axes {' or '.join(map(str, sorted(declared)))}, "
                             f"not {tuple(sorted(axes))}")
        try:  # the spec's own functions refuse values they cannot describe (a dtype, a tile)
            spec.signature(axes)
            if target is not None:
                arch = targets.get(target).spec_arch()
                if spec.launch_config(axes, arch) is not None:
                    spec.compile_constexprs(axes, arch)
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{where}: {type(e).__name__}: {e}") from None
        if (key, target) not in seen:
            seen.add((key, target))
            out.append((key, target))
    return out
