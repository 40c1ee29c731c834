"""Exceptions that name what is at fault (a field, a file, a sandbox id)."""


class TryloopError(Exception):
    """Base class of every error tryloop raises on purpose. `exit_code` is the status the CLI
    exits with for it (docs/config.md lists them): scripts can tell the kinds apart."""

    exit_code = 1


class ConfigError(TryloopError):
    """A configuration file or field is invalid; the message names it."""

    exit_code = 78  # sysexits.h EX_CONFIG


class InputMissing(TryloopError):
    """A store, run, step or item that a command reads does not exist; the message names it and the
    field that points at it. Stores opened with `create=False` raise it instead of making a new,
    empty store where a path was mistyped."""

    exit_code = 66  # sysexits.h EX_NOINPUT


class HostUnsupported(TryloopError):
    """The host lacks a kernel feature or privilege a sandbox needs.

    Raised instead of silently running a weaker sandbox; `missing` lists what is absent.
    """

    exit_code = 69  # sysexits.h EX_UNAVAILABLE

    def __init__(self, message: str, missing: list[str] | None = None):
        super().__init__(message)
        self.missing = missing or []


class SandboxError(TryloopError):
    """A sandbox operation failed (infrastructure, not the agent's command)."""

    exit_code = 71  # sysexits.h EX_OSERR


class SandboxClosed(SandboxError):
    """The sandbox was closed or its init process died."""


class PathOutsideSandbox(SandboxError):
    """A file-API path tried to leave the sandbox root or reach a special file."""
