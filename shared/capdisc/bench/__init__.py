"""Benchmark support: catalogs as capabilities, retrieval metrics and the token report."""
