"""core__send_email: a plain-text email through Django's mail framework.

Always held for a human (requires_confirmation): an email cannot be unsent.
"""

from __future__ import annotations

from typing import Any

from pydantic import EmailStr, Field, field_validator
from pydantic_core import PydanticCustomError

from apps.tools.capabilities import Capabilities
from apps.tools.contracts import Redaction, ToolContext, ToolContract, ToolOutput, ToolParams


class SendEmailParams(ToolParams):
    to: list[EmailStr] = Field(min_length=1, max_length=10)
    subject: str = Field(min_length=1, max_length=200)
    body: str = Field(min_length=1, max_length=10000)

    @field_validator("to", mode="before")
    @classmethod
    def _a_list(cls, value: Any) -> Any:
        """A single address is refused, as the schema says, but with the shape to send:
        agents guess `"to": "bob@example.com"` (issue 46)."""
        if isinstance(value, str):
            raise PydanticCustomError(
                "list_type", 'expected a list of addresses, e.g. ["bob@example.com"]'
            )
        return value


class EmailSent(ToolOutput):
    sent: int = Field(description="Number of messages handed to the mail server")
    recipients: int


def send_email(params: SendEmailParams, ctx: ToolContext, caps: Capabilities) -> EmailSent:
    ctx.check_cancelled()  # the mailer checks again just before the hand-over
    sent = caps.require("mail").send([str(a) for a in params.to], params.subject, params.body)
    return EmailSent(sent=sent, recipients=len(params.to))


CONTRACTS = [
    ToolContract(
        name="send_email",
        description="Send a plain-text email. Every call waits for a human to approve it.",
        params=SendEmailParams,
        result=EmailSent,
        execute=send_email,
        effect="external_side_effect",
        consequence_level="medium",
        requires_confirmation=True,
        capabilities=("mail",),
        redaction=Redaction(result=("sent", "recipients"), args=("to", "subject", "body")),
        tags=("email",),
    )
]
