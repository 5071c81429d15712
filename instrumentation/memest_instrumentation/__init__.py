"""memest's instrumentation: PyTorch allocator hooks (``torch``) and the vLLM plugin (``vllm``).

Imports memest (schema, analysis), never the reverse.
"""
