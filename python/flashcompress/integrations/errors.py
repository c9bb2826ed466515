"""The named errors of the engine integrations (standard library only, importable without torch)."""

from __future__ import annotations


class IntegrationError(RuntimeError):
    """An integration cannot be applied (engine missing or too different, already applied)."""


class UnsupportedVersionError(IntegrationError):
    """The installed engine version is not one the integration was checked against."""


class UnsupportedFeatureError(NotImplementedError):
    """The engine asked for something flashcompress does not implement.

    Raised before anything is written, in place of a silently wrong store.
    """
