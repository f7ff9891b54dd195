"""The command line: `mlxcel serve`, `mlxcel launch` and `mlxcel-server`, a module a flag group."""
