"""The ``sessionloop`` command line (click)."""
