"""What a compile worker process of `aotc build` is, beyond the compile itself: an environment
pinned so that a machine's settings cannot change the bytes, and a prompt, clean stop.

Pinned: environment variables that change what Triton or its tools emit are dropped (so the
bundled ptxas compiles, with Triton's default options), and the tools the worker starts run
without address-space randomization: ptxas 12.8 assigns spill slots in an order that follows heap
addresses, so with randomization the same PTX gave two cubins (gdn_chunk_state at head size 256:
two 64-bit spill slots swapped, same registers and stack size); without it, one on a given
machine. Another C library can still lay the heap out differently: build releases on one image
and check them with `aotc check-reproducible`.

Stopped: SIGINT (a Ctrl-C reaches the whole process group) or SIGTERM (the parent stopping its
pool) unwinds the compile in flight, whose temporary files are removed on the way out, then ends
the process; an idle worker just ends. Never a traceback, never a next job.
"""
from __future__ import annotations

import os
import signal
import sys
import tempfile

# Variables Triton 3.6 (knobs.py and libtriton's cache-invalidating list) reads that change a
# binary: tool paths and options, compiler switches, overrides. aot/build.py sets its own
# switches after they are dropped.
COMPILE_ENV = (
    "TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH", "TRITON_CUOBJDUMP_PATH", "TRITON_NVDISASM_PATH",
    "PTXAS_OPTIONS", "DISABLE_PTXAS_OPT", "TRITON_MOCK_PTX_VERSION", "TRITON_LIBDEVICE_PATH",
    "DISABLE_LLVM_OPT", "LLVM_PASS_PLUGIN_PATH", "TRITON_DEFAULT_FP_FUSION", "TRITON_F32_DEFAULT",
    "DISABLE_MMA_V3", "DISABLE_MMA_V5", "ALLOW_LHS_TMEM_LAYOUT_CONVERSION", "TRITON_OVERRIDE_ARCH",
    "TRITON_ENABLE_EXPERIMENTAL_CONSAN", "TRITON_INSTRUMENTATION_MODE", "TRITON_ENABLE_ASAN",
    "TRITON_KERNEL_OVERRIDE", "TRITON_OVERRIDE_DIR", "TRITON_ALWAYS_COMPILE", "USE_IR_LOC",
    "LLVM_EXTRACT_DI_LOCAL_VARIABLES", "TRITON_CACHE_MANAGER", "TRITON_REMOTE_CACHE_BACKEND",
    "AMDGCN_USE_BUFFER_ATOMICS", "AMDGCN_ANALYZE_SMALL_TENSOR_RANGE", "AMDGCN_SCALARIZE_PACKED_FOPS",
    "TRITON_HIP_USE_BLOCK_PINGPONG", "TRITON_HIP_USE_IN_THREAD_TRANSPOSE", "TRITON_HIP_USE_ASYNC_COPY",
    "TRITON_INTERPRET",
)
ADDR_NO_RANDOMIZE = 0x0040000  # linux/personality.h


def pin_environment() -> list[str]:
    """Drop COMPILE_ENV from this process's environment, and the temporary-folder variables where
    /tmp is usable; the names that were set."""
    names = COMPILE_ENV
    # Even without randomization ptxas's choice follows its heap layout, which the length of its
    # file names shifts: Triton writes them to the temporary folder, so that is /tmp everywhere.
    if os.path.isdir("/tmp") and os.access("/tmp", os.W_OK | os.X_OK):
        names += ("TMPDIR", "TEMP", "TMP")
        tempfile.tempdir = None
    dropped = [name for name in names if name in os.environ]
    for name in dropped:
        del os.environ[name]
    return dropped


def no_address_randomization() -> bool:
    """Programs this process starts from now on (ptxas) run without address-space randomization:
    Linux's personality flag, inherited across exec. False where the system refuses it (a seccomp
    profile) or is not Linux; the build then runs as before."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        current = libc.personality(0xFFFFFFFF)  # query
        if current == -1:
            return False
        return libc.personality(current | ADDR_NO_RANDOMIZE) != -1 and \
            bool(libc.personality(0xFFFFFFFF) & ADDR_NO_RANDOMIZE)
    except (OSError, AttributeError):
        return False


class Stopped(BaseException):
    """Raised inside a worker's compile by SIGINT/SIGTERM: a BaseException, so no `except
    Exception` in a compiler swallows it."""


_busy = False


def _on_stop(signum, frame) -> None:
    if _busy:
        raise Stopped(signum)
    os._exit(128 + signum)  # idle (waiting for a job, starting up): nothing to clean


def install_stop_handlers() -> None:
    """Called first thing in a worker. The parent spawns workers with SIGINT blocked (so a Ctrl-C
    during their start-up cannot print a KeyboardInterrupt traceback); unblocking here delivers
    one that came meanwhile, to this handler."""
    signal.signal(signal.SIGINT, _on_stop)
    signal.signal(signal.SIGTERM, _on_stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def run_stoppable(fn, *args):
    """Run one job; a stop signal during it ends the process once the job's cleanup has run."""
    global _busy
    _busy = True
    try:
        return fn(*args)
    except Stopped as stop:
        os._exit(128 + stop.args[0])
    finally:
        _busy = False
