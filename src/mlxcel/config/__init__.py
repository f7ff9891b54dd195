"""The server's settings: `ServerConfig` and `ModelConfig` (settings.py), the YAML config file
(file.py), the value converters both read (values.py), and which engine serves a model
(engines.py)."""
