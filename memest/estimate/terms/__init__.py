"""The term model: every full-initialization term, one object each (catalog.py).

A term has a reader (from a report's phase readings), the plugin's reading (around vLLM's
graph-memory profiling), a law (from config.json and the grid, derived from vLLM's code; the
coefficients of coefficients.py only where the code cannot give the number), the law's range
and a mover (the term at another grid). The pre-flight's laws, the report's and the plugin's
terms and the what-if's movers are loops over ``catalog.TERMS``. setup.py is what a law reads;
shape.py, context.py and dsa.py the parameter bytes, the prefill-over-context term and what a
DSA model's indexer adds.
"""
