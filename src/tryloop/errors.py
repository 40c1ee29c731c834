"""Exceptions that name what is at fault (a field, a file, a sandbox id)."""


class TryloopError(Exception):
    """Base class of every error tryloop raises on purpose."""


class ConfigError(TryloopError):
    """A configuration file or field is invalid; the message names it."""


class HostUnsupported(TryloopError):
    """The host lacks a kernel feature or privilege a sandbox needs.

    Raised instead of silently running a weaker sandbox; `missing` lists what is absent.
    """

    def __init__(self, message: str, missing: list[str] | None = None):
        super().__init__(message)
        self.missing = missing or []


class SandboxError(TryloopError):
    """A sandbox operation failed (infrastructure, not the agent's command)."""


class SandboxClosed(SandboxError):
    """The sandbox was closed or its init process died."""


class PathOutsideSandbox(SandboxError):
    """A file-API path tried to leave the sandbox root or reach a special file."""
