"""toolhub as an OAuth protected resource: its identifier (RFC 8707), its metadata
(RFC 9728) and the challenge of a refused request (RFC 6750), as the MCP authorization
spec (2025-11-25, 2026-07-28) asks of an MCP server.

The resource is TOOLHUB_OAUTH_RESOURCE, or `<scheme>://<host>/mcp` of the request: the
MCP endpoint's canonical URL, which MCP clients send as `resource` and issuers put in a
token's `aud`. One identifier covers /mcp/, the run streams and the REST API: they are
one resource server, and the scope (TOOLHUB_OAUTH_SCOPE) says what a token may use.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

METADATA_PATH = "/.well-known/oauth-protected-resource"

# RFC 6750 3: error_description is %x20-21 / %x23-5B / %x5D-7E (no quote, no backslash).
_UNQUOTABLE = re.compile(r"[^\x20\x21\x23-\x5b\x5d-\x7e]")


class Refusal(Exception):
    """A Bearer credential refused: the status, RFC 6750's error code (empty when no
    credential was given) and a sentence saying what is wrong."""

    def __init__(self, status: int, error: str, description: str, scope: str = "") -> None:
        super().__init__(description)
        self.status, self.error, self.description, self.scope = status, error, description, scope


def resource_for(scheme: str, host: str) -> str:
    """toolhub's resource identifier for a request with this scheme and (validated) Host."""
    if settings.TOOLHUB_OAUTH_RESOURCE:
        return str(settings.TOOLHUB_OAUTH_RESOURCE)
    web_scheme = "https" if scheme in ("https", "wss") else "http"
    return f"{web_scheme}://{host.lower()}/mcp"


def metadata_url(resource: str) -> str:
    """Where the resource's metadata is (RFC 9728 3.1: the well-known path goes between
    the origin and the resource's path)."""
    parts = urlsplit(resource)
    return f"{parts.scheme}://{parts.netloc}{METADATA_PATH}{parts.path.rstrip('/')}"


def metadata(resource: str) -> dict[str, Any]:
    servers = (
        [settings.TOOLHUB_OAUTH_EXTERNAL_ISSUER] if settings.TOOLHUB_OAUTH_EXTERNAL_ISSUER else []
    )
    if settings.TOOLHUB_OAUTH_SERVER:  # toolhub's own (server.py): the resource's origin
        parts = urlsplit(resource)
        servers.append(f"{parts.scheme}://{parts.netloc}")
    return {
        "resource": resource,
        "authorization_servers": servers,
        "scopes_supported": [settings.TOOLHUB_OAUTH_SCOPE],
        "bearer_methods_supported": ["header"],
        "resource_name": "toolhub",
    }


def challenge(refusal: Refusal, resource: str) -> str:
    """The WWW-Authenticate value of a 401 or 403: where the metadata is, and for a
    credential that was given, what was wrong with it."""
    params = [("realm", "toolhub"), ("resource_metadata", metadata_url(resource))]
    if refusal.error:
        params.append(("error", refusal.error))
        params.append(("error_description", _UNQUOTABLE.sub("'", refusal.description)))
    # The scope a token needs (MCP 2025-11-25: clients ask for what the challenge names).
    params.append(("scope", refusal.scope or settings.TOOLHUB_OAUTH_SCOPE))
    return "Bearer " + ", ".join(f'{name}="{value}"' for name, value in params)
