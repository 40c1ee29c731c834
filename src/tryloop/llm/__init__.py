"""Talking to OpenAI-compatible model servers: the client, its typed errors, and a scripted server.

`ChatClient` is what policies and judges call; `ScriptedServer` is a real HTTP
server answering from a script, for tests, benchmarks and fault injection.
"""

from tryloop.llm.client import ChatClient
from tryloop.llm.errors import (
    LLMConnectionError,
    LLMError,
    LLMHTTPError,
    LLMProtocolError,
    LLMTimeout,
)
from tryloop.llm.result import ChatResult, ParsedToolCall, Usage
from tryloop.llm.scripted_server import ReceivedRequest, ScriptedReply, ScriptedServer

__all__ = [
    "ChatClient", "ChatResult", "LLMConnectionError", "LLMError", "LLMHTTPError", "LLMProtocolError",
    "LLMTimeout", "ParsedToolCall", "ReceivedRequest", "ScriptedReply", "ScriptedServer", "Usage",
]
