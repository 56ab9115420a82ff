"""The actors and the agent runtime of sessionloop (SPEC §2, §4; seed 002 "Agent 与 Session")."""
