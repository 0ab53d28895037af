"""One turn, the same on every surface, and the capabilities it calls."""
