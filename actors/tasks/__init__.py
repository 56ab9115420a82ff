"""Background tasks: commands that outlived their tool call, one actor each."""
