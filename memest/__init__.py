"""memest: where vLLM startup memory goes, and how much KV cache the GPU really holds.

The core (schema, plan, analysis, estimate) is pure Python and never imports torch, fastapi or
sqlalchemy.
"""

from memest._version import __version__

__all__ = ["__version__"]
