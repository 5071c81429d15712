"""memest.plan."""
