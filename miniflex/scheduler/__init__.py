"""The scheduler half of the connector: lookups, the cost model's decisions, plans, commits.

It runs inside vLLM's scheduler (the EngineCore process), owns the tiers' metadata and
never touches KV bytes; it imports neither vLLM nor torch (``tests/unit/test_import_rules.py``).
:class:`~miniflex.scheduler.manager.MiniFlexManager` is its coordinator.
"""
