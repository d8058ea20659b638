"""toolhub's Python client: an agent loop hands toolhub its model's tool calls as they are."""

from toolhub_client.client import Toolhub, ToolhubError
from toolhub_client.results import AnthropicBatch, Held, Invocation, OpenAIBatch, ToolResult

__all__ = [
    "AnthropicBatch",
    "Held",
    "Invocation",
    "OpenAIBatch",
    "ToolResult",
    "Toolhub",
    "ToolhubError",
]
