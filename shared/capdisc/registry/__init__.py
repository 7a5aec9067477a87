"""The registry: events, manifests and their validation, the policy of applying events, and the
records, outbox and dead letters in Redis."""
