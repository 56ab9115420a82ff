"""The gateway: JSON-RPC frames from WebSocket clients in, actor messages out, projections back."""
