"""What runs in a model's worker process (`python -m mlxcel.worker`): the main loop, the outbox
back to the HTTP process, a service per model kind, and loading the engine. Nothing here imports
the HTTP side (api/, serving/, models/)."""
