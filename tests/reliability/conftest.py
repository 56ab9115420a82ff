from tests.e2e.conftest import server, server_factory  # noqa: F401  (real servers for these tests)
