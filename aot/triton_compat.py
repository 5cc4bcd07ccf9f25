"""Every call into Triton's compiler internals (they move between minor versions): Triton 3.6.

`compile_variant` turns (KernelSpec, VariantKey, target) into a binary (a cubin for cuda, an hsaco
code object for hip; loader/targets.py says which) plus the launch metadata
the manifest records, building the same ASTSource that Triton's JIT builds for a call whose
arguments match the key's specialization, so the bytes are the JIT's bytes.
"""
from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass

from aotc.kernels.variants import KernelSpec, VariantKey
from aotc.loader import targets
from aotc.loader.recipe import SUPPORTED_TRITON, compile_options, jit_function
from aotc.loader.targets import TargetInfo

BUILD_RECIPE = ("python -m venv aotc-build && aotc-build/bin/pip install 'aotc[build]' "
                "(from a checkout: pip install -e '.[build]')")


class UnsupportedTritonError(RuntimeError):
    """`aotc build` found no Triton, or one whose compiler internals this module does not know."""


def installed_triton() -> str | None:
    """The installed Triton's version from package metadata (nothing imported), or None."""
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return None


def is_supported(version: str | None) -> bool:
    """A local build tag (3.6.0+git1234) is the same release."""
    return version is not None and version.split("+")[0] == SUPPORTED_TRITON


def triton_version() -> str:
    """The installed Triton's version, refused unless the build supports it. Read from package
    metadata: the incremental no-op build never imports triton, and the check runs before any
    compile is planned."""
    version = installed_triton()
    if not is_supported(version):
        found = f"Triton {version} is installed" if version else "Triton is not installed"
        raise UnsupportedTritonError(
            f"aotc build compiles with Triton {SUPPORTED_TRITON} only, and {found}. The runtime needs no "
            f"Triton, so keep the one your torch wants there and build in an environment of its own: "
            f"{BUILD_RECIPE}. The built artifacts run beside any Triton.")
    return version


@dataclass
class Compiled:
    cubin: bytes  # the binary, whatever its kind (cubin, hsaco): the name older callers read
    symbol: str
    params: list[str]
    param_names: list[str]
    metadata: dict
    triton_hash: str


def check_consistency(spec: KernelSpec, fn) -> None:
    """The spec's argument list must be the kernel's, and its specialization switches must match."""
    runtime = [p for p in fn.params if not p.is_constexpr]
    names = [p.name for p in runtime]
    if names != [a.name for a in spec.args]:
        raise ValueError(f"{spec.name}: spec args {[a.name for a in spec.args]} != kernel params {names}")
    constexprs = sorted(p.name for p in fn.params if p.is_constexpr)
    if constexprs != sorted(spec.constexpr_names):
        raise ValueError(f"{spec.name}: spec constexprs {sorted(spec.constexpr_names)} != kernel's {constexprs}")
    for p, a in zip(runtime, spec.args):
        if a.kind == "ptr" and p.do_not_specialize_on_alignment == a.aligned:
            raise ValueError(f"{spec.name}.{a.name}: pointer declared aligned={a.aligned} but the kernel's "
                             f"do_not_specialize_on_alignment says {p.do_not_specialize_on_alignment}")
        if a.kind == "i32" and p.do_not_specialize == a.aligned:
            raise ValueError(f"{spec.name}.{a.name}: int declared aligned={a.aligned} but the kernel's "
                             f"do_not_specialize says {p.do_not_specialize}")


def ast_source(spec: KernelSpec, fn, signature, constexprs, attrs):
    """The source Triton's JIT builds for the function: Gluon's for a @gluon.jit kernel."""
    if spec.kind == "gluon":
        from triton.experimental.gluon._runtime import GluonASTSource

        return GluonASTSource(fn, signature, constexprs=constexprs, attrs=attrs)
    from triton.compiler import ASTSource

    return ASTSource(fn, signature, constexprs=constexprs, attrs=attrs)


def check_backend(info: TargetInfo) -> None:
    """Raise, before anything compiles, when the installed Triton has no backend for `info`
    (Triton's wheel carries cuda and hip; Iluvatar's corex comes with FlagTree's Triton)."""
    import importlib.util
    from pathlib import Path

    folder = {"cuda": "nvidia", "hip": "amd", "corex": "iluvatar"}[info.backend]
    module = f"triton.backends.{folder}"
    # Looked up on disk, not imported: a no-op rebuild never imports Triton.
    spec = importlib.util.find_spec("triton")
    found = bool(spec and spec.origin) and (Path(spec.origin).parent / "backends" / folder / "compiler.py").is_file()
    if not found:
        if info.backend == "corex":
            raise ValueError(
                f"target {info.name} (Iluvatar CoreX) needs FlagTree's Triton with the Iluvatar backend "
                f"({module}, package {info.triton_package!r}, built from FlagTree's third_party/iluvatar "
                f"on a CoreX SDK machine); this environment's Triton has no {module}. Nothing was compiled.")
        raise ValueError(f"target {info.name} needs Triton's {info.backend} backend ({module}), which the "
                         f"installed Triton lacks. Nothing was compiled.")


# NVIDIA SMs the build accepts: Triton supports compute capability 8.0 and up, and these are the
# ones that exist (a typo such as sm10 or sm91 would otherwise fail every compile, late).
CUDA_SMS = (80, 86, 87, 89, 90, 100, 101, 103, 110, 120, 121)


def check_target(info: TargetInfo) -> None:
    """Raise, before anything compiles, for an NVIDIA target Triton cannot compile for."""
    if info.backend == "cuda" and info.arch not in CUDA_SMS:
        raise ValueError(f"target {info.name}: not an NVIDIA architecture aotc builds for (Triton "
                         f"{SUPPORTED_TRITON} compiles for {', '.join(f'sm{s}' for s in CUDA_SMS)}). "
                         "Nothing was compiled.")


def compile_variant(spec: KernelSpec, key: VariantKey, target: str | int | TargetInfo) -> Compiled:
    """Compile one variant for a target (a name from loader/targets.py, its row, or an int SM)."""
    import triton
    from triton.backends.compiler import GPUTarget

    if isinstance(target, int):
        target = f"sm{target}"
    info = target if isinstance(target, TargetInfo) else targets.get(target)
    if not is_supported(triton.__version__):  # metadata and module can disagree (a second copy on the path)
        raise UnsupportedTritonError(f"aotc builds with Triton {SUPPORTED_TRITON}; imported "
                                     f"{triton.__version__} from {triton.__file__}")
    check_backend(info)
    fn = jit_function(spec, interpreted_ok=False)
    check_consistency(spec, fn)
    arch = info.spec_arch()
    axes = key.axis_dict
    cfg = spec.launch_config(axes, arch)
    if cfg is None:
        raise ValueError(f"{key}: the spec declares no such variant for {info.name}")
    sig_by_name = spec.signature(axes)
    # The JIT orders the signature by the function's parameters; so do we.
    signature = {name: sig_by_name[name] for name in fn.arg_names}
    constexprs = spec.compile_constexprs(axes, arch)
    missing = set(spec.constexpr_names) - set(constexprs)
    if missing:
        raise ValueError(f"{key}: spec.constexprs gave no value for {sorted(missing)}")
    divisible = spec.divisible_args(key.level)
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    src = ast_source(spec, fn, signature, {(fn.arg_names.index(k),): v for k, v in constexprs.items()}, attrs)
    with compile_options():  # the recipe's switches, as the JIT fallback compiles
        kernel = triton.compile(src, target=GPUTarget(info.backend, info.arch, info.warp_size),
                                options=cfg.triton_options())
    md = kernel.metadata
    # Both backends append the same two scratch pointers (Triton 3.6: nvidia/driver.py and
    # amd/driver.py). HIP's launcher always passes 0 for global scratch and its metadata has no
    # global_scratch_*, cluster_dims or launch_pdl: recorded as 0 / (1, 1, 1) / False.
    params = [sig_by_name[a.name] for a in spec.args] + ["*i8", "*i8"]
    names = [a.name for a in spec.args] + ["global_scratch", "profile_scratch"]
    if getattr(md, "warp_size", info.warp_size) != info.warp_size:
        raise ValueError(f"{key}: Triton compiled for warp size {md.warp_size}, target {info.name} has {info.warp_size}")
    metadata = {
        "num_warps": md.num_warps, "num_stages": md.num_stages, "num_ctas": md.num_ctas,
        "cluster_dims": list(getattr(md, "cluster_dims", (1, 1, 1))), "shared": md.shared,
        "global_scratch_size": getattr(md, "global_scratch_size", 0),
        "global_scratch_align": getattr(md, "global_scratch_align", 1),
        "profile_scratch_size": md.profile_scratch_size, "profile_scratch_align": md.profile_scratch_align,
        "launch_cooperative_grid": bool(md.launch_cooperative_grid),
        "launch_pdl": bool(getattr(md, "launch_pdl", False)),
        "tensordesc": bool(md.tensordesc_meta),
    }
    if metadata["tensordesc"]:
        raise ValueError(f"{key}: kernels with tensor descriptors need host-side TMA descriptors, "
                         "which the aotc launcher does not build")
    return Compiled(kernel.asm[info.asm], md.name, params, names, metadata, md.hash)
