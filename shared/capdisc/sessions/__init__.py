"""Sessions: the working-set policy (pure) and its store in Redis."""
