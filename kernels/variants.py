"""Variant declarations shared by the build (aotc.aot) and the runtime (aotc.loader).

A kernel family's `spec.py` declares each Triton kernel once as a `KernelSpec`: its runtime
parameters in order (with the 16-byte/divisible-by-16 assumptions of the specialized binary),
its constexpr parameters, the variants to build and the launch config per target. A
`VariantKey` names one binary: kernel, constexpr axes and specialization level. Keys are
typed values with a canonical string that round-trips (`VariantKey.parse(str(k)) == k`).

Stdlib only: the build and the loader import this without torch or triton.
"""
from __future__ import annotations

import re
from typing import Callable, Iterable, Mapping

# Specialization levels. ALIGNED: every `Arg(aligned=True)` pointer is 16-byte aligned and
# every `Arg(aligned=True)` int is divisible by 16 (Triton's `tt.divisibility = 16`).
# GENERIC: no assumption, so any call runs.
ALIGNED = "aligned"
GENERIC = "generic"
LEVELS = (ALIGNED, GENERIC)

ARG_KINDS = ("ptr", "i32", "fp32")


class _Record:
    """An immutable record compared and hashed by `_compared`. (A frozen dataclass does the same,
    but creating each class costs ~1 ms at import, and the loader's first call imports these.)"""

    __slots__ = ()
    _compared: tuple = ()

    def _init(self, **values) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _key(self) -> tuple:
        return tuple(getattr(self, f) for f in self._compared)

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def as_dict(self) -> dict:
        return {f: getattr(self, f) for f in self._compared}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{f}={getattr(self, f)!r}' for f in self._compared)})"


class Arg(_Record):
    """One runtime (non-constexpr) kernel parameter, in declaration order.

    `aligned`: for a pointer, the ALIGNED binary assumes data_ptr % 16 == 0; for an i32,
    it assumes value % 16 == 0 (strides of rows that hold whole 16-byte vectors). Ints that
    are not `aligned` are never value-specialized: the kernel lists them in
    `do_not_specialize`, so one binary serves every length, batch or stride.
    `dtype`: for a pointer, the axis whose value names its element type (e.g. "kv"), or a
    fixed Triton element type after "=" (e.g. "=i32", "=fp32").
    """

    __slots__ = _compared = ("name", "kind", "aligned", "dtype")

    def __init__(self, name: str, kind: str, aligned: bool = False, dtype: str = ""):
        self._init(name=name, kind=kind, aligned=aligned, dtype=dtype)
        if self.kind not in ARG_KINDS:
            raise ValueError(f"Arg {self.name}: kind must be one of {ARG_KINDS}, got {self.kind!r}")
        if self.kind == "ptr" and not self.dtype:
            raise ValueError(f"Arg {self.name}: a pointer needs dtype ('=i32' or an axis name)")
        if self.kind == "fp32" and self.aligned:
            raise ValueError(f"Arg {self.name}: a float cannot be divisibility-specialized")


class LaunchConfig(_Record):
    """Triton compile options of a variant. `maxnreg` (0: none) caps registers a thread, which
    ptxas bakes into the binary; the JIT fallback passes the same cap, so its bytes match.
    `launch_pdl`: launch as a programmatic dependent launch (sm90+): the kernel may start while
    the previous kernel on the stream finishes, so it must wait for it (griddepcontrol.wait)
    before reading what that kernel wrote; a kernel declares a `PDL` constexpr for that (see
    KernelSpec.compile_constexprs)."""

    __slots__ = _compared = ("num_warps", "num_stages", "num_ctas", "maxnreg", "launch_pdl")

    def __init__(self, num_warps: int, num_stages: int, num_ctas: int = 1, maxnreg: int = 0,
                 launch_pdl: bool = False):
        self._init(num_warps=num_warps, num_stages=num_stages, num_ctas=num_ctas, maxnreg=maxnreg,
                   launch_pdl=bool(launch_pdl))
        if self.maxnreg and not 24 <= self.maxnreg <= 255:
            raise ValueError(f"maxnreg must be 0 (none) or 24..255, got {self.maxnreg}")

    def triton_options(self) -> dict:
        """The compile options Triton takes, for triton.compile and for a JIT launch alike."""
        opts = {"num_warps": self.num_warps, "num_stages": self.num_stages, "num_ctas": self.num_ctas}
        if self.maxnreg:
            opts["maxnreg"] = self.maxnreg
        if self.launch_pdl:
            opts["launch_pdl"] = True
        return opts


_KEY_RE = re.compile(r"^(?P<kernel>[A-Za-z_][A-Za-z0-9_]*)\((?P<axes>[^)]*)\)@(?P<level>[a-z]+)$")
_AXIS_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _axis_value(text: str) -> int | str:
    return int(text) if re.fullmatch(r"-?[0-9]+", text) else text


class VariantKey(_Record):
    """Names one binary: `kernel(axis=value,...)@level`, axes sorted by name."""

    __slots__ = _compared = ("kernel", "axes", "level")

    def __init__(self, kernel: str, axes: tuple[tuple[str, int | str], ...], level: str = ALIGNED):
        self._init(kernel=kernel, axes=axes, level=level)

    def __lt__(self, other: "VariantKey") -> bool:
        return self._key() < other._key()

    @staticmethod
    def make(kernel: str, axes: Mapping[str, int | str], level: str = ALIGNED) -> "VariantKey":
        for name, value in axes.items():
            if not _AXIS_RE.match(name):
                raise ValueError(f"axis name {name!r} is not an identifier")
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise TypeError(f"axis {name}: value must be int or str, got {type(value).__name__}")
            if isinstance(value, str) and not re.fullmatch(r"[A-Za-z0-9_.]+", value):
                raise ValueError(f"axis {name}: value {value!r} has characters a key cannot hold")
        if level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
        return VariantKey(kernel, tuple(sorted(axes.items())), level)

    @staticmethod
    def parse(text: str) -> "VariantKey":
        m = _KEY_RE.match(text.strip())
        if not m:
            raise ValueError(f"not a variant key: {text!r} (expected kernel(axis=value,...)@level)")
        axes = {}
        if m["axes"]:
            for part in m["axes"].split(","):
                name, sep, value = part.partition("=")
                if not sep:
                    raise ValueError(f"not a variant key: {text!r} (axis {part!r} has no '=')")
                axes[name] = _axis_value(value)
        return VariantKey.make(m["kernel"], axes, m["level"])

    def __str__(self) -> str:
        return f"{self.kernel}({','.join(f'{k}={v}' for k, v in self.axes)})@{self.level}"

    @property
    def axis_dict(self) -> dict[str, int | str]:
        return dict(self.axes)

    def with_level(self, level: str) -> "VariantKey":
        return VariantKey.make(self.kernel, self.axis_dict, level)


class TargetArch(int):
    """What a spec's `launch(axes, arch)` receives: an int that compares as the NVIDIA SM number
    (90 for sm90; 0 for AMD and Iluvatar targets, so `arch >= 90` never turns on an sm90-only
    feature such as PDL there), carrying the target itself for a spec that needs more:
    `arch.target` ("sm90", "gfx942", "ivcore20"), `arch.backend` ("cuda", "hip", "corex"),
    `arch.warp_size`. Specs written against a plain int keep working. A plain int passed where a
    TargetArch is expected means the NVIDIA target smN (`as_target_arch`)."""

    def __new__(cls, value: int, target: str, backend: str, warp_size: int):
        self = super().__new__(cls, value)
        self.target, self.backend, self.warp_size = target, backend, warp_size
        return self

    def __repr__(self) -> str:
        return f"TargetArch({int(self)}, {self.target!r}, {self.backend!r}, {self.warp_size})"

    def __reduce__(self):
        return (TargetArch, (int(self), self.target, self.backend, self.warp_size))


def as_target_arch(arch) -> TargetArch:
    if isinstance(arch, TargetArch):
        return arch
    if isinstance(arch, bool) or not isinstance(arch, int):
        raise TypeError(f"arch must be a TargetArch or an NVIDIA SM number, got {arch!r}")
    return TargetArch(arch, f"sm{arch}", "cuda", 32)


def sm90_gluon_launch(implements: Callable[[Mapping], bool]) -> Callable:
    """The `launch` of a warp-specialized Gluon kernel (wgmma, setmaxnreg: sm90 only): num_warps 4
    is the default partition (one consumer warpgroup) and the binary's metadata gives the launch's
    warps; None (not built) on other targets and for axes `implements` refuses."""

    def launch(axes, arch) -> LaunchConfig | None:
        if getattr(arch, "backend", "cuda") != "cuda" or int(arch) != 90 or not implements(axes):
            return None
        return LaunchConfig(num_warps=4, num_stages=1)

    return launch


# Compile options only Triton's CUDA backend takes: another backend ignores them, so the build
# drops them there and the manifest records what was compiled.
_CUDA_ONLY = ("maxnreg", "launch_pdl")


class KernelSpec(_Record):
    """Everything needed to compile and launch one `@triton.jit` kernel, as data.

    `constexprs(axes)` maps a variant's axes to the values of every constexpr parameter.
    `variants()` yields the axes dicts to build. `launch(axes, arch)` gives num_warps and
    num_stages for a target (arch a `TargetArch`: an int, e.g. 90, carrying the target's name,
    backend and warp size), or None where the variant does not exist on that target (it is not
    built there and a call for it raises NotImplementedError naming the target). `sources` lists
    files (relative to the spec's folder) whose bytes feed the build hash, beside the kernel's
    module and every module it imports from its folder or aotc.kernels (aot/sources.py finds
    those: a build is incremental on that hash).
    `target_constexprs(axes, arch)`, where given, adds constexpr values that follow the target
    (an instruction one backend lacks), merged by `compile_constexprs`.
    `levels`: the specialization levels built (both by default). A kernel that cannot compile
    without ALIGNED's assumptions declares (ALIGNED,) and its op routes only calls that meet them
    to it: a call missing them has no binary and would take the JIT fallback.
    `kind`: "triton" (`@triton.jit`) or "gluon" (`@gluon.jit`, built through Gluon's AST source;
    its `launch` num_warps is the default partition's, the binary's total is in its metadata).
    """

    __slots__ = ("name", "module", "function", "args", "constexpr_names", "constexprs", "variants", "launch",
                 "sources", "folder", "target_constexprs", "levels", "kind", "arg_index", "first_ptr",
                 "leading_ptrs")
    _compared = __slots__[:13]

    def __init__(self, name: str, module: str, function: str, args: tuple[Arg, ...],
                 constexpr_names: tuple[str, ...],
                 constexprs: Callable[[Mapping[str, int | str]], dict[str, int | str | bool | float]],
                 variants: Callable[[], Iterable[Mapping[str, int | str]]],
                 launch: Callable[[Mapping[str, int | str], int], LaunchConfig],
                 sources: tuple[str, ...] = ("kernel.py",), folder: str = "",
                 target_constexprs: Callable[[Mapping[str, int | str], "TargetArch"], dict] | None = None,
                 levels: tuple[str, ...] = LEVELS, kind: str = "triton"):
        self._init(name=name, module=module, function=function, args=tuple(args),
                   constexpr_names=tuple(constexpr_names), constexprs=constexprs, variants=variants, launch=launch,
                   sources=tuple(sources), folder=folder, target_constexprs=target_constexprs,
                   levels=tuple(levels), kind=kind)
        if not self.levels or any(level not in LEVELS for level in self.levels):
            raise ValueError(f"{self.name}: levels must be a non-empty subset of {LEVELS}, got {self.levels}")
        if self.kind not in ("triton", "gluon"):
            raise ValueError(f"{self.name}: kind must be 'triton' or 'gluon', got {self.kind!r}")
        names = [a.name for a in self.args]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: duplicate argument names")
        ptrs = [i for i, a in enumerate(self.args) if a.kind == "ptr"]
        if not ptrs:
            raise ValueError(f"{self.name}: a kernel needs at least one pointer argument")
        self._init(arg_index={n: i for i, n in enumerate(names)},
                   first_ptr=ptrs[0],  # the first pointer's tensor tells the op's device
                   # pointers before the first non-pointer: the prefix a prepared launch repacks per call
                   leading_ptrs=next((i for i, a in enumerate(self.args) if a.kind != "ptr"), len(self.args)))

    def compile_constexprs(self, axes: Mapping[str, int | str], arch: int) -> dict:
        """Every constexpr value for a variant on a target: `constexprs(axes)`, plus `PDL` (1 when
        the target's launch config asks for a programmatic dependent launch) for a kernel that
        declares it. The wait it guards is an sm90+ instruction, so it follows the target. Then
        the spec's `target_constexprs`, if any."""
        values = dict(self.constexprs(axes))
        if self.target_constexprs is not None:
            values.update(self.target_constexprs(axes, as_target_arch(arch)))
        if "PDL" in self.constexpr_names:
            cfg = self.launch_config(axes, arch)
            values["PDL"] = int(bool(cfg and cfg.launch_pdl))
        return values

    def launch_config(self, axes: Mapping[str, int | str], arch) -> LaunchConfig | None:
        """`launch(axes, arch)` for a target (a TargetArch, or an int meaning smN), None where the
        spec declares no such variant there; CUDA-only options dropped on other backends."""
        arch = as_target_arch(arch)
        cfg = self.launch(axes, arch)
        if cfg is None or arch.backend == "cuda" or not any(getattr(cfg, o) for o in _CUDA_ONLY):
            return cfg
        return LaunchConfig(num_warps=cfg.num_warps, num_stages=cfg.num_stages, num_ctas=cfg.num_ctas)

    def keys(self, arch=None) -> list[VariantKey]:
        """Every declared binary: each variant at each of the spec's specialization levels; with
        `arch`, only the variants the spec declares for that target (launch not None)."""
        out = []
        for axes in self.variants():
            if arch is not None and self.launch_config(axes, arch) is None:
                continue
            for level in self.levels:
                out.append(VariantKey.make(self.name, axes, level))
        return out

    def signature(self, axes: Mapping[str, int | str]) -> dict[str, str]:
        """Triton signature (runtime params then constexprs) for a variant's axes."""
        sig = {}
        for a in self.args:
            if a.kind == "ptr":
                dt = a.dtype[1:] if a.dtype.startswith("=") else TRITON_DTYPES[str(axes[a.dtype])]
                sig[a.name] = "*" + dt
            else:
                sig[a.name] = a.kind
        for name in self.constexpr_names:
            sig[name] = "constexpr"
        return sig

    def divisible_args(self, level: str) -> tuple[str, ...]:
        """Names of the params that carry `tt.divisibility = 16` at this level."""
        if level == GENERIC:
            return ()
        return tuple(a.name for a in self.args if a.aligned)


# Element types as Triton spells them in a signature, by the names the axes use.
TRITON_DTYPES = {
    "fp16": "fp16",
    "bf16": "bf16",
    "fp32": "fp32",
    "int8": "i8",
    "uint8": "u8",
    "int4": "i8",  # two 4-bit values per byte, read as int8
    "fp8_e4m3": "fp8e4nv",
    "fp8_e5m2": "fp8e5",
    "i32": "i32",
}
