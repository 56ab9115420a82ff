"""The actor system's machinery: the runtime and its services, the pool, the directory, the worker loop."""
