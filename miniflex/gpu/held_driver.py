"""CUDA driver calls that keep the interpreter lock, for the staged mover's copy issue.

Every CUDA call made through torch's or CuPy's bindings releases the GIL for
its few microseconds. When vLLM's thread is waiting for the lock (the store
thread took it from it), it gets it at once, and the store thread then waits
for it again, up to ``sys.getswitchinterval()`` (5 ms), before forcing
another switch that interrupts vLLM's thread once more. A store of 32 chunks
makes dozens of such calls. Through ``ctypes.PyDLL`` the same driver calls
keep the lock, so a whole store or load is issued in one stretch of the
interpreter, and only the final wait releases it.

``libcuda.so.1`` is loaded on first use, never at import. Handles are the
runtime's (a ``cudaStream_t`` is a ``CUstream``, a ``cudaEvent_t`` a ``CUevent``);
calls act in the calling thread's current context, the device's primary
context that torch and CuPy use.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from typing import Any

from miniflex.errors import TransferError

__all__ = ["HeldLaunch", "bind", "copy_async", "record", "wait_event"]

_P = ctypes.c_void_p
_SIGNATURES: dict[str, tuple[Any, ...]] = {
    "cuEventRecord": (_P, _P),
    "cuStreamWaitEvent": (_P, _P, ctypes.c_uint),
    "cuMemcpyAsync": (ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, _P),
    "cuLaunchKernel": (_P, *(ctypes.c_uint,) * 7, _P, _P, _P),
    "cuGetErrorName": (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
    "cuCtxGetCurrent": (ctypes.POINTER(_P),),
    "cuCtxSetCurrent": (_P,),
    "cuDeviceGet": (ctypes.POINTER(ctypes.c_int), ctypes.c_int),
    "cuDevicePrimaryCtxRetain": (ctypes.POINTER(_P), ctypes.c_int),
}


@functools.cache
def _driver() -> Any:
    """The CUDA driver library, loaded so that its calls keep the GIL (``PyDLL``)."""
    try:
        lib = ctypes.PyDLL("libcuda.so.1")
    except OSError as exc:
        raise TransferError(f"the CUDA driver library could not be loaded: {exc}") from exc
    for name, args in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = list(args), ctypes.c_int
    return lib


def _check(code: int, what: str) -> None:
    if code:
        name = ctypes.c_char_p()
        _driver().cuGetErrorName(code, ctypes.byref(name))
        raise TransferError(f"{what} failed: {(name.value or b'').decode() or code}")


def bind(device_index: int) -> None:
    """Give the calling thread a current context, the device's primary one, if it has none
    (a thread whose only CUDA calls so far went through this module has none)."""
    lib, ctx = _driver(), _P()
    _check(lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if ctx.value:
        return
    dev = ctypes.c_int()
    _check(lib.cuDeviceGet(ctypes.byref(dev), device_index), "cuDeviceGet")
    _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    _check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def record(event: int, stream: int) -> None:
    """``cuEventRecord``: ``event`` marks the work queued on ``stream`` so far."""
    _check(_driver().cuEventRecord(event, stream), "cuEventRecord")


def wait_event(stream: int, event: int) -> None:
    """``cuStreamWaitEvent``: work queued on ``stream`` from now on waits for ``event``."""
    _check(_driver().cuStreamWaitEvent(stream, event, 0), "cuStreamWaitEvent")


def copy_async(dst: int, src: int, nbytes: int, stream: int) -> None:
    """``cuMemcpyAsync`` between unified addresses (device or registered host memory)."""
    _check(_driver().cuMemcpyAsync(dst, src, nbytes, stream), "cuMemcpyAsync")


class HeldLaunch:
    """Launches one compiled kernel (a ``CUfunction``) with arguments of fixed C types; the
    argument block is built once and refilled per launch (the driver copies it)."""

    def __init__(self, function: int, types: Sequence[type[ctypes._SimpleCData]]) -> None:
        _driver()  # a missing driver library fails here, when the mover is built
        self.function = function
        self._args = [t() for t in types]
        self._params = (_P * len(types))(*(ctypes.addressof(a) for a in self._args))

    def __call__(self, grid: int, block: int, stream: int, *values: int) -> None:
        """Queue the kernel on ``stream`` with ``values`` (one per type, in order)."""
        if len(values) != len(self._args):
            raise TransferError(f"the kernel takes {len(self._args)} arguments, got {len(values)}")
        for arg, value in zip(self._args, values, strict=True):
            arg.value = value
        code = _driver().cuLaunchKernel(
            self.function, grid, 1, 1, block, 1, 1, 0, stream, self._params, None
        )
        _check(code, "cuLaunchKernel")
