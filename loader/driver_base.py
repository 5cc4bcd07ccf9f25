"""What the CUDA and HIP ctypes bindings (cuda_driver.py, hip_driver.py) share: the error they
raise, raw entry points resolved on first use, and the occupancy query bracketed by the binding's
own push/pop of the device."""
from __future__ import annotations

import ctypes


class DriverError(RuntimeError):
    """A driver call returned a status other than success: the call, the code and its name and text."""

    def __init__(self, call: str, code: int, name: str, text: str):
        super().__init__(f"{call} failed: {name} ({code}): {text}")
        self.code = code


class LazyDriver:
    """Base of a binding: `PREFIX`-named attributes ("cu", "hip") are the library's raw entry
    points, looked up on first use through the subclass's `_open()` and cached on the instance.
    Subclasses provide `_open`, `check`, `push` and `pop`, and name their occupancy entry point."""

    PREFIX = ""
    OCCUPANCY = ""  # the library's max-active-blocks-per-multiprocessor call

    def __getattr__(self, name):
        if self.PREFIX and name.startswith(self.PREFIX):
            fn = getattr(self._open(), name)
            self.__dict__[name] = fn
            return fn
        raise AttributeError(name)

    def occupancy(self, device: int, function: int, block: int, shared: int) -> int:
        """Blocks of `block` threads and `shared` dynamic bytes of `function` that fit one SM
        (compute unit) at once."""
        self.push(device)
        try:
            n = ctypes.c_int()
            self.check(self.OCCUPANCY, getattr(self, self.OCCUPANCY)(ctypes.byref(n), function, block, shared))
            return n.value
        finally:
            self.pop()
