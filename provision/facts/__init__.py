"""Custom pyinfra facts: a shell command plus a pure parser, one module per system."""
