"""The kernel families aotc builds and loads: one `spec` module each, read by build and runtime alike."""
from __future__ import annotations

import importlib
import importlib.util
import os
from functools import lru_cache
from pathlib import Path

from .variants import KernelSpec

FAMILY_SPECS = (
    "aotc.kernels.decode.spec",
    "aotc.kernels.decode.mla_spec",
    "aotc.kernels.prefix_prefill.spec",
    "aotc.kernels.gated_delta.spec",
    "aotc.kernels.gated_delta.chunk_spec",
    "aotc.kernels.gated_delta.state_ws_spec",
)


# Extra families (e.g. a user's own kernels, or the test suite's tiny kernel): comma-separated
# spec module names. Build workers and the loader read the same variable.
ENV_EXTRA = "AOTC_EXTRA_SPECS"


def family_modules() -> tuple[str, ...]:
    extra = tuple(m.strip() for m in os.environ.get(ENV_EXTRA, "").split(",") if m.strip())
    return FAMILY_SPECS + extra


class SpecModuleError(ValueError):
    """A module named in AOTC_EXTRA_SPECS cannot be imported or declares no KERNELS."""


def all_specs() -> dict[str, KernelSpec]:
    """Every declared kernel by name. Built-in families whose spec module is absent are skipped;
    a module named in AOTC_EXTRA_SPECS must import (else SpecModuleError naming it)."""
    return _load(family_modules())


@lru_cache(maxsize=None)
def _load(modules: tuple[str, ...]) -> dict[str, KernelSpec]:
    out: dict[str, KernelSpec] = {}
    for module_name in modules:
        extra = module_name not in FAMILY_SPECS
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if not extra and e.name == module_name:
                continue
            if not extra:
                raise
            raise SpecModuleError(
                f"{ENV_EXTRA} names {module_name!r}, which cannot be imported ({e}); set it to importable "
                "spec modules, comma-separated (each defining KERNELS), or unset it") from None
        if extra and not isinstance(getattr(module, "KERNELS", None), (list, tuple)):
            raise SpecModuleError(f"{ENV_EXTRA} names {module_name!r}, which defines no KERNELS list")
        for spec in module.KERNELS:
            if spec.name in out:
                raise ValueError(f"kernel name {spec.name!r} declared twice")
            out[spec.name] = spec
    return out


def get_spec(name: str) -> KernelSpec:
    specs = all_specs()
    if name not in specs:
        raise KeyError(f"no kernel named {name!r}; declared: {', '.join(sorted(specs))}")
    return specs[name]


def spec_folder(spec: KernelSpec) -> Path:
    """The family folder holding the kernel's sources."""
    if spec.folder:
        return Path(spec.folder)
    # find_spec imports the parent packages only, never the Triton source itself.
    return Path(importlib.util.find_spec(spec.module).origin).parent
