"""A session: its state as a fold of events, the pure decisions, and the actor shell around them."""
