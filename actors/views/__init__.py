"""Pure read models of a session's events: the items the protocol shows, the listing record, the index."""
