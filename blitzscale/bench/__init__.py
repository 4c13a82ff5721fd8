"""Benchmarks that print JSON; their results go to docs/benchmarks.md."""
