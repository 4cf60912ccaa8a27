"""Entry points: the hooks, the runtime shim, and the operator commands."""
