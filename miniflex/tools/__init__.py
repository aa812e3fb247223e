"""What users run, above the library: the ``miniflex`` CLI (``cli.py``), ``serve``, the
demo and its toy models, ``tune``, ``inspect`` and the benchmark harness (``bench/``).

Tools import the library; nothing in the library imports tools (a test holds it).
"""
