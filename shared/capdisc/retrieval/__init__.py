"""Retrieval: ranking capabilities for a query (hybrid lexical and dense scoring, calibrated
relevance, decomposition), with no I/O."""
