"""The actors and the agent runtime of sessionloop (the session actors, the agent loop and the services they share)."""
