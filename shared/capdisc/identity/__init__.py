"""Who asks: signed identity tokens and the gate workers admit requests through."""
