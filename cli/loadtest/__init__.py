"""The load generator of ``sessionloop bench`` against a deployment: workloads (TOML), the engine
that drives them through :mod:`sessionloop.client`, the results file, its plot and comparisons."""
