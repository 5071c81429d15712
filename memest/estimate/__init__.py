"""memest.estimate."""
