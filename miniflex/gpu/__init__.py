"""Worker-side movers between vLLM's KV cache and the CPU pool: torch, CuPy kernel, DMA."""
