"""toolhub's Python client: an agent loop hands toolhub its model's tool calls as they are."""

from toolhub_client.client import Toolhub, ToolhubError
from toolhub_client.receipts import ReceiptError, fetch_jwks, verify_receipt
from toolhub_client.results import AnthropicBatch, Held, Invocation, OpenAIBatch, ToolResult

__all__ = [
    "AnthropicBatch",
    "Held",
    "Invocation",
    "OpenAIBatch",
    "ReceiptError",
    "ToolResult",
    "Toolhub",
    "ToolhubError",
    "fetch_jwks",
    "verify_receipt",
]
