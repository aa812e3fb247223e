"""Page-locking the host pool for CUDA: DMA needs it, and the kernel mover maps it.

Registration goes through the driver API (``cuda.bindings``) where it is
installed, else through torch's runtime bindings. With the driver API,
pinning is idempotent: a range a mover already registered reports True (the
driver answers "already registered" and, unlike the runtime, keeps no error
state that torch's next kernel launch would trip over). So the CUDA movers,
which pin with ``mapped=True`` in their constructors, and the handler, which
pins after building the mover, share one registration; the handler undoes
it with :func:`unpin` at shutdown.
"""

from __future__ import annotations

import logging

import torch

from miniflex.errors import TransferError
from miniflex.gpu import cuda_driver

__all__ = ["device_pointer", "pin", "unpin"]

logger = logging.getLogger("miniflex.gpu")

_TORCH_FLAGS_PORTABLE_MAPPED = 0x03  # cudaHostRegisterPortable | cudaHostRegisterMapped


def pin(address: int, nbytes: int, mapped: bool = False) -> bool:
    """Page-lock ``nbytes`` at ``address``; True if the range is locked when this returns.

    ``mapped`` also maps it into the device's address space (zero-copy
    access from kernels; see :func:`device_pointer`). False (and a warning)
    where CUDA can't: unpinned memory still works for the torch mover, at a
    fraction of the PCIe bandwidth, so a failure here costs speed, never
    correctness.
    """
    if not torch.cuda.is_available():
        return False
    if cuda_driver.available():
        cuda_driver.ensure_context(torch.cuda.current_device())
        code = cuda_driver.register(address, nbytes, mapped)
        if code == cuda_driver.ALREADY_REGISTERED:
            return True
    else:
        flags = _TORCH_FLAGS_PORTABLE_MAPPED if mapped else 0
        err = torch.cuda.cudart().cudaHostRegister(address, nbytes, flags)
        code = int(getattr(err, "value", err))
    if code != 0:
        logger.warning(
            "registering %d bytes of host memory with CUDA failed (error %d); pool is pageable",
            nbytes,
            code,
        )
        return False
    return True


def unpin(address: int) -> None:
    if not torch.cuda.is_available():
        return
    if cuda_driver.available():
        cuda_driver.ensure_context(torch.cuda.current_device())
        cuda_driver.unregister(address)  # NOT_REGISTERED is fine: nothing to undo
    else:
        torch.cuda.cudart().cudaHostUnregister(address)


def device_pointer(address: int) -> int:
    """The address kernels use for pinned host memory at ``address``.

    With ``cuda.bindings`` the driver is asked; without it, unified
    addressing (every 64-bit CUDA platform) makes it the host address.
    """
    if not cuda_driver.available():
        return address
    try:
        cuda_driver.ensure_context(torch.cuda.current_device())
        return cuda_driver.device_pointer(address)
    except TransferError as exc:
        raise TransferError(
            f"the CPU pool at {address:#x} is not mapped for the GPU ({exc}); "
            "pin it with pin(..., mapped=True) first"
        ) from exc
