"""provision: from a rack of new GPU servers to a proven training cluster."""

__version__ = "0.1.0"
