"""The public Python API: the Host (the composition root) and the Session Loop API for bots."""
