"""The package version, in a module of its own so that any layer can read it without importing
the public API in ortprep/__init__.py (which imports the pipeline)."""

__version__ = "0.1.0"
