"""The tool's version, kept at the bottom layer so that every package can report it."""

__version__ = "0.1.0"
