"""The runtime's exception hierarchy: one base type a caller can catch for everything we raise."""

from __future__ import annotations


class Nvfp4Error(Exception):
    """Base of every error this package raises on purpose."""


class ManifestError(Nvfp4Error):
    """The artifact directory or its manifest is missing, malformed or inconsistent."""


class ArtifactError(ManifestError):
    """A cubin is missing, altered, for another architecture, or disagrees with its recorded ABI."""


class NoKernelError(Nvfp4Error):
    """No built kernel serves the requested problem shapes on this device."""


class DeviceError(Nvfp4Error):
    """No usable CUDA device: none visible, or the one asked for does not exist."""


class InputError(Nvfp4Error, ValueError):
    """An argument of a runtime call is invalid (dtype, device, shape, layout, alignment)."""


class CudaError(Nvfp4Error):
    """A CUDA driver call failed."""

    def __init__(self, call: str, code: int, name: str = "") -> None:
        self.call = call
        self.code = int(code)
        self.name = name
        named = f" ({name})" if name else ""
        super().__init__(f"{call} failed with CUDA error {self.code}{named}")
