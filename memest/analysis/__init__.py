"""memest.analysis."""
