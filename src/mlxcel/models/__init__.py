"""Models as the server holds them: loading one from its config, and the registry of all."""
