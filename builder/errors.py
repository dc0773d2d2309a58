"""Errors the builder raises on purpose; the CLI maps each to an exit code."""

from __future__ import annotations


class BuilderError(Exception):
    """Base of every error the builder raises on purpose."""


class SpecError(BuilderError):
    """shapes.yaml is invalid. The message names the file, the set and the key (exit code 2)."""


class BuildError(BuilderError):
    """A kernel failed to build or check, or the artifact directory cannot be written (exit 1)."""
