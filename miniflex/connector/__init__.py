"""vLLM integration: ``MiniFlexConnector`` (the only package that imports vLLM)."""

from miniflex.connector.connector import MiniFlexConnector

__all__ = ["MiniFlexConnector"]
