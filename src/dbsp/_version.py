"""The package's version, in a module of its own so that every layer can name it (a worker
reports the version it runs when it registers, and checkpoints record it)."""

__version__ = "0.1.0"
