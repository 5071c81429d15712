"""Builds of a model over time: a start's facts and identity (runs.py), build A against build B
(compare.py), a model's builds and the regression policy (history.py). It reads the accounting
(memest.estimate) and the analysis; reporters, the CLI and the service format what it returns."""
