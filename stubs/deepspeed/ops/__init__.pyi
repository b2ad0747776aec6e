# Probed lazily on first access (module __getattr__); lrft switches ops off in it before init.
__compatible_ops__: dict[str, bool]
