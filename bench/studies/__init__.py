"""Dated one-off studies, frozen: each docstring opens with its conclusion."""
