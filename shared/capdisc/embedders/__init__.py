"""Embedders: the port, its local implementations and the OpenAI adapter."""
