"""Replay-based debugging: a session's log read back as a timeline, checked against what the
system serves, and re-run to see whether the runtime is deterministic.

One module per role (the commands in ``cli/`` are the shell that reads the store and prints):

* ``values``: plain values, their first difference and the fold, shared by all;
* ``timeline``: "what happened?" -- the rows ``sessionloop replay`` prints;
* ``live``: what a live host or a running server serves for a session;
* ``verify``: "does what the system serves follow from the log?" (``replay --verify``);
* ``plan``, ``compare``, ``rerun``: "is the runtime deterministic?" -- the re-run's plan read from
  the recording, the comparison of two logs, and the re-run itself (``sessionloop rerun``).
"""
