"""Benchmarks behind `tryloop bench`; runners and results live in benchmarks/."""
