"""MCP sessions as signed ids: any server process can serve any session, nothing is stored.

A session id carries what `initialize` settled (the API key it belongs to, the run
its calls join, the protocol version) and is signed with the secret key, so a
client can neither forge one nor move one to another key. Nothing is kept per
session, so scale-out needs no shared store and there is nothing to bound or sweep.
A session ends when its key is revoked (every request re-checks the key) or after
TOOLHUB_MCP_SESSION_TTL_S; the client then gets 404 and, as the transport says,
starts a new session. DELETE is answered 405 ("this server does not let clients
end sessions"): with nothing stored there is nothing to end, and the session grants
nothing that the key does not.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.conf import settings
from django.core import signing

SALT = "toolhub.mcp.session"


def new_run_id() -> str:
    return f"run_mcp_{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Session:
    api_key_id: int
    run_id: str
    protocol_version: str

    @classmethod
    def start(cls, api_key_id: int, protocol_version: str, run_id: str | None = None) -> Session:
        """A new session, with the run its calls join unless a call names another: the
        one its client named (Toolhub-Run-Id, methods.session_run), else a new one."""
        return cls(api_key_id, run_id or new_run_id(), protocol_version)

    @property
    def id(self) -> str:
        payload = {"k": self.api_key_id, "r": self.run_id, "v": self.protocol_version}
        return signing.dumps(payload, salt=SALT, compress=True)

    @classmethod
    def find(cls, session_id: str, api_key_id: int) -> Session | None:
        """The session named by a client, if it is genuine, unexpired and this key's."""
        if len(session_id) > 512:
            return None
        try:
            payload = signing.loads(
                session_id, salt=SALT, max_age=settings.TOOLHUB_MCP_SESSION_TTL_S
            )
        except signing.BadSignature:  # SignatureExpired is one
            return None
        if not isinstance(payload, dict) or payload.get("k") != api_key_id:
            return None
        return cls(api_key_id, str(payload["r"]), str(payload["v"]))
