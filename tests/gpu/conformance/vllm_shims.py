"""The few `vllm` modules that vLLM 0.33.0's attention kernel tests and Triton kernel files import,
written for the conformance sandbox (vllm_runner.py): enough of each for those files, nothing else.

Facts they mirror (vLLM 0.33.0): `KVQuantMode`'s member values (vllm/v1/kv_cache_interface.py);
`get_fp8_min_max()` is float8_e4m3fn's range on CUDA (its quant_utils.py);
`STR_DTYPE_TO_TORCH_DTYPE` maps "fp8", "fp8_e4m3" and "fp8_e5m2" to uint8 storage
(vllm/utils/torch_utils.py); `current_platform.fp8_dtype()` is float8_e4m3fn on CUDA;
`envs.VLLM_BATCH_INVARIANT` defaults to off.
"""
from __future__ import annotations

PLATFORMS = '''
"""Shim of vllm.platforms for the conformance sandbox: a CUDA platform from torch's view of it."""
import torch


def _capability(device_id):
    # (0, 0) without a CUDA device, so the files still import where the runner only collects
    return torch.cuda.get_device_capability(device_id) if torch.cuda.is_available() else (0, 0)


class _CudaPlatform:
    device_type = "cuda"
    device_name = "cuda"

    def is_rocm(self):
        return False

    def is_cuda(self):
        return True

    def is_cuda_alike(self):
        return True

    def is_xpu(self):
        return False

    def is_cpu(self):
        return False

    def fp8_dtype(self):
        return torch.float8_e4m3fn

    def get_device_capability(self, device_id=0):
        from collections import namedtuple

        major, minor = _capability(device_id)
        cap = namedtuple("DeviceCapability", "major minor")(major, minor)
        return cap

    def has_device_capability(self, capability, device_id=0):
        major, minor = _capability(device_id)
        want = capability if isinstance(capability, int) else capability[0] * 10 + capability[1]
        return major * 10 + minor >= want

    def is_device_capability(self, capability, device_id=0):
        major, minor = _capability(device_id)
        return major * 10 + minor == capability

    def is_device_capability_family(self, capability, device_id=0):
        major, _ = _capability(device_id)
        return major == capability // 10

    def manual_seed_all(self, seed):
        torch.cuda.manual_seed_all(seed)


current_platform = _CudaPlatform()
'''

TRITON_UTILS = '''
"""Shim of vllm.triton_utils: the installed Triton."""
import triton
import triton.language as tl

HAS_TRITON = True
'''

MATH_UTILS = '''
"""Shim of vllm.utils.math_utils: the integer helpers the kernel files and tests import."""


def cdiv(a, b):
    return -(a // -b)


def next_power_of_2(n):
    return 1 if n < 1 else 1 << (n - 1).bit_length()


def largest_power_of_2_divisor(n):
    return n & -n


def round_up(x, y):
    return cdiv(x, y) * y
'''

TORCH_UTILS = '''
"""Shim of vllm.utils.torch_utils: dtype names and seeding."""
import random

import torch

STR_DTYPE_TO_TORCH_DTYPE = {
    "float32": torch.float32, "half": torch.half, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float": torch.float, "fp8": torch.uint8, "fp8_e4m3": torch.uint8, "fp8_e5m2": torch.uint8,
    "int8": torch.int8,
}


def set_random_seed(seed, data_parallel_index=0):
    if seed is None:
        return
    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
'''

LOGGER = '''
"""Shim of vllm.logger: a standard logger with vLLM's *_once methods."""
import logging


class _Logger(logging.LoggerAdapter):
    _seen = set()

    def _once(self, level, msg, *args, **kwargs):
        kwargs.pop("scope", None)
        if (level, msg) not in self._seen:
            self._seen.add((level, msg))
            self.log(level, msg, *args, **kwargs)

    def debug_once(self, msg, *args, **kwargs):
        self._once(logging.DEBUG, msg, *args, **kwargs)

    def info_once(self, msg, *args, **kwargs):
        self._once(logging.INFO, msg, *args, **kwargs)

    def warning_once(self, msg, *args, **kwargs):
        self._once(logging.WARNING, msg, *args, **kwargs)


def init_logger(name):
    return _Logger(logging.getLogger(name), {})
'''

ENVS = '''
"""Shim of vllm.envs: the settings the kernel files read, at vLLM's defaults."""
VLLM_BATCH_INVARIANT = False
'''

PLATFORMS_ROCM = '''
"""Shim of vllm.platforms.rocm: chunked_prefill_paged_decode asks it whether to run ROCm's custom
paged attention, which never applies on CUDA."""


def use_rocm_custom_paged_attention(*args, **kwargs):
    return False
'''

CUSTOM_OPS = '''
"""Shim of vllm._custom_ops: vLLM's compiled ops are not in the sandbox (the Triton kernels the
tests exercise do not call them on CUDA)."""


def __getattr__(name):
    raise NotImplementedError(f"vllm._custom_ops.{name}: vLLM's compiled ops are not part of the conformance sandbox")
'''

KV_CACHE_INTERFACE = '''
"""Shim of vllm.v1.kv_cache_interface: KVQuantMode's values, and whether a kv_cache_dtype string
quantizes (the fp8 and per-token-head names; vLLM's triton_reshape_and_cache_flash imports it)."""
from enum import IntEnum


class KVQuantMode(IntEnum):
    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4
    NVFP4 = 5

    @property
    def is_per_token_head(self):
        return self in (KVQuantMode.INT8_PER_TOKEN_HEAD, KVQuantMode.FP8_PER_TOKEN_HEAD,
                        KVQuantMode.INT4_PER_TOKEN_HEAD)


def is_quantized_kv_cache(kv_cache_dtype):
    return kv_cache_dtype.startswith("fp8") or kv_cache_dtype.endswith("_per_token_head")
'''

QUANT_UTILS = '''
"""Shim of vllm.model_executor.layers.quantization.utils.quant_utils: the fp8 dtype and range on CUDA."""
import torch


FP8_DTYPE = torch.float8_e4m3fn


def get_fp8_min_max():
    finfo = torch.finfo(torch.float8_e4m3fn)
    return finfo.min, finfo.max
'''

# module path (relative to the sandbox root) -> source
COMMON = {
    "vllm/__init__.py": '"""Shim package of vLLM for the conformance sandbox."""\n',
    "vllm/platforms/__init__.py": PLATFORMS,
    "vllm/platforms/rocm.py": PLATFORMS_ROCM,
    "vllm/triton_utils/__init__.py": TRITON_UTILS,
    "vllm/utils/__init__.py": "",
    "vllm/utils/math_utils.py": MATH_UTILS,
    "vllm/utils/torch_utils.py": TORCH_UTILS,
    "vllm/logger.py": LOGGER,
    "vllm/envs.py": ENVS,
    "vllm/_custom_ops.py": CUSTOM_OPS,
    "vllm/v1/__init__.py": "",
    "vllm/v1/kv_cache_interface.py": KV_CACHE_INTERFACE,
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/layers/__init__.py": "",
    "vllm/model_executor/layers/quantization/__init__.py": "",
    "vllm/model_executor/layers/quantization/utils/__init__.py": "",
    "vllm/model_executor/layers/quantization/utils/quant_utils.py": QUANT_UTILS,
    "vllm/v1/attention/__init__.py": "",
    "vllm/v1/attention/ops/__init__.py": "",
}

# vLLM's own kernel files (copied from the sdist into the sandbox, never into the repo)
KERNEL_FILES = ("prefix_prefill.py", "chunked_prefill_paged_decode.py", "triton_unified_attention.py",
                "triton_attention_helpers.py", "triton_decode_attention.py", "int4_per_token_head.py",
                "triton_reshape_and_cache_flash.py")

# In the aotc sandbox an entry-point module re-exports vLLM's module (for the internals some tests
# import: reduce_segments, softmax_step, ...) with the entry points bound to aotc.compat.vllm.
AOTC_BINDINGS = {
    "prefix_prefill.py": ("context_attention_fwd",),
    "chunked_prefill_paged_decode.py": ("chunked_prefill_paged_decode",),
    "triton_unified_attention.py": ("unified_attention",),
    "triton_decode_attention.py": ("decode_attention_fwd",),
}


def aotc_binding(module: str, names: tuple[str, ...]) -> str:
    """Source of an entry-point module: vLLM's module `_vllm_<module>` re-exported, `names` from aotc."""
    base = module[:-3]
    lines = [f'"""{base}: vLLM\'s module, its entry points bound to aotc.compat.vllm (conformance sandbox)."""',
             f"from vllm.v1.attention.ops._vllm_{base} import *  # noqa: F401,F403",
             f"from vllm.v1.attention.ops import _vllm_{base} as _peer",
             "",
             "globals().update({k: v for k, v in vars(_peer).items() if not k.startswith('__')})",
             f"from aotc.compat.vllm import {', '.join(names)}  # noqa: E402,F401",
             ""]
    return "\n".join(lines)
