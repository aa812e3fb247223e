"""The worker half of the connector: it executes the scheduler's plans and owns the bytes.

It runs in each vLLM worker process (one per TP rank): the CPU pool, the movers bound to
vLLM's KV tensors, the SSD store and the threads that run jobs. It imports torch but not
vLLM (``tests/unit/test_import_rules.py``). :class:`~miniflex.worker.handler.MiniFlexHandler`
is its entry point.
"""
