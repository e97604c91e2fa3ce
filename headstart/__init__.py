"""headstart: answer while the user is still typing."""

__version__ = "0.1.0"
