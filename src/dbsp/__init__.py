"""dbsp: incremental view maintenance (DBSP) for Python."""

__version__ = "0.1.0"
