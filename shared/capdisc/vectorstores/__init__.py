"""Vector stores: the port, the in-memory reference store and the Weaviate adapter."""
