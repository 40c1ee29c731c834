"""Typed failures of a call to an OpenAI-compatible model server.

Callers decide by type, never by message: a timeout or a 5xx is the server's
trouble (retry, or record no-verdict), a 4xx is ours (the request is wrong and
will stay wrong), a protocol error means the server answered something that is
not the OpenAI shape. `retryable` says whether the same request may succeed
if sent again.
"""

from __future__ import annotations

from tryloop.errors import TryloopError


class LLMError(TryloopError):
    """Base class of every failure of a model-server call."""

    @property
    def retryable(self) -> bool:
        return False


class LLMTimeout(LLMError):
    """No complete answer within the client's wall-clock limit."""

    def __init__(self, message: str, timeout_s: float):
        super().__init__(message)
        self.timeout_s = timeout_s

    @property
    def retryable(self) -> bool:
        return True


class LLMConnectionError(LLMError):
    """The connection could not be made or broke before a full answer arrived."""

    @property
    def retryable(self) -> bool:
        return True


class LLMHTTPError(LLMError):
    """The server answered with a non-2xx status; `body` is the start of what it said."""

    def __init__(self, message: str, status: int, body: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.status = status
        self.body = body
        self.retry_after_s = retry_after_s   # the server's Retry-After, in seconds, when it sent one

    @property
    def is_server_error(self) -> bool:
        return 500 <= self.status <= 599

    @property
    def retryable(self) -> bool:
        # 5xx: the server's trouble. 429: it asks us to come back later. Other 4xx:
        # the request itself is wrong and sending it again cannot help.
        return self.is_server_error or self.status in (408, 429)


class LLMProtocolError(LLMError):
    """A 2xx answer that is not valid JSON or not the OpenAI shape; the message names the field."""
