"""Micro-benchmarks of MiniFlex components (run each as ``python -m bench.<name>``)."""
