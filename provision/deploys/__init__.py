"""pyinfra deploys of `provision up`, one module per domain; each defines `step`."""
