"""One module per command; each exposes a plain function the CLI and tests call."""
