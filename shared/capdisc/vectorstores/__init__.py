"""Vector stores: the port and its filters, the in-memory store and the Weaviate adapter."""
