"""memest.reporters."""
