"""The few CUDA driver calls MiniFlex makes itself, through ``cuda.bindings.driver``.

Imported lazily: nothing here loads ``cuda.bindings`` (or the driver) until a
function is called, so this module is safe to import on machines without
CUDA. The driver API keeps no per-thread "last error", so a failed call here
never leaks into torch's or CuPy's error state (a failed
``cudaHostRegister`` through the runtime would surface at torch's next
kernel launch on that thread).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from miniflex.errors import TransferError

__all__ = [
    "available",
    "check",
    "device_pointer",
    "driver",
    "ensure_context",
    "make_current",
    "primary_context",
    "register",
    "unregister",
]

HOST_REGISTER_PORTABLE = 0x01
HOST_REGISTER_DEVICEMAP = 0x02
ALREADY_REGISTERED = 712  # CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
NOT_REGISTERED = 713  # CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED


def available() -> bool:
    """Whether ``cuda.bindings`` (the cuda-bindings package) can be imported."""
    try:
        return importlib.util.find_spec("cuda.bindings") is not None
    except ModuleNotFoundError:  # no ``cuda`` namespace package at all
        return False


def driver() -> Any:
    from cuda.bindings import driver as drv

    return drv


def check(result: Any, what: str) -> Any:
    """Unpack a ``cuda.bindings`` result tuple; TransferError naming ``what`` on failure."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        _, name = driver().cuGetErrorName(err)
        raise TransferError(f"{what} failed: {name.decode() if name else int(err)}")
    return values[0] if len(values) == 1 else tuple(values)


def primary_context(device_index: int) -> Any:
    """The device's primary context (the one torch and CuPy use), retained."""
    drv = driver()
    dev = check(drv.cuDeviceGet(device_index), "cuDeviceGet")
    return check(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")


def make_current(context: Any) -> None:
    """Make ``context`` current on the calling thread (cheap; driver calls need one)."""
    check(driver().cuCtxSetCurrent(context), "cuCtxSetCurrent")


def ensure_context(device_index: int) -> None:
    """Give the calling thread a current context (the primary one) if it has none."""
    drv = driver()
    check(drv.cuInit(0), "cuInit")
    ctx = check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if ctx is None or int(ctx) == 0:
        make_current(primary_context(device_index))


def register(address: int, nbytes: int, mapped: bool) -> int:
    """``cuMemHostRegister``; returns the CUresult as an int.

    0: registered now; :data:`ALREADY_REGISTERED`: some earlier call did it.
    """
    flags = HOST_REGISTER_PORTABLE | (HOST_REGISTER_DEVICEMAP if mapped else 0)
    (err,) = driver().cuMemHostRegister(address, nbytes, flags)
    return int(err)


def unregister(address: int) -> int:
    """``cuMemHostUnregister``; :data:`NOT_REGISTERED` if nothing was registered there."""
    (err,) = driver().cuMemHostUnregister(address)
    return int(err)


def device_pointer(address: int) -> int:
    """The device address of registered host memory (zero-copy access from kernels)."""
    ptr = check(driver().cuMemHostGetDevicePointer(address, 0), "cuMemHostGetDevicePointer")
    return int(ptr)
