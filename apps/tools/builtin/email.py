"""core__send_email: a plain-text email through Django's mail framework.

Always held for a human (requires_confirmation): an email cannot be unsent.
"""

from __future__ import annotations

from pydantic import EmailStr, Field

from apps.tools.capabilities import Capabilities
from apps.tools.contracts import Redaction, ToolContext, ToolContract, ToolOutput, ToolParams


class SendEmailParams(ToolParams):
    to: list[EmailStr] = Field(min_length=1, max_length=10)
    subject: str = Field(min_length=1, max_length=200)
    body: str = Field(min_length=1, max_length=10000)


class EmailSent(ToolOutput):
    sent: int = Field(description="Number of messages handed to the mail server")
    recipients: int


def send_email(params: SendEmailParams, ctx: ToolContext, caps: Capabilities) -> EmailSent:
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
