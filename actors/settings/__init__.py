"""Session settings and their layers, the config.toml document, apps, and the text catalogue."""
