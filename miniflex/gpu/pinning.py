"""Page-locking the host pool for CUDA DMA (``cudaHostRegister`` through torch)."""

from __future__ import annotations

import logging

import torch

__all__ = ["pin", "unpin"]

logger = logging.getLogger("miniflex.gpu")


def pin(address: int, nbytes: int) -> bool:
    """Page-lock ``nbytes`` at ``address``; False (and a warning) where CUDA can't.

    Unpinned memory still works, at a fraction of the PCIe bandwidth, so a
    failure here degrades speed, never correctness.
    """
    if not torch.cuda.is_available():
        return False
    err = torch.cuda.cudart().cudaHostRegister(address, nbytes, 0)
    code = int(getattr(err, "value", err))
    if code != 0:
        logger.warning(
            "cudaHostRegister of %d bytes failed (error %d); pool is pageable", nbytes, code
        )
        return False
    return True


def unpin(address: int) -> None:
    if torch.cuda.is_available():
        torch.cuda.cudart().cudaHostUnregister(address)
