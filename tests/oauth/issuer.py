"""A token issuer for the checks toolhub makes itself (expiry, algorithms, claims): a real
HTTP server publishing an OpenID discovery document and a JWKS, and signing tokens with
its key. Interop with an issuer nobody here wrote is tests/oauth/test_external_issuer.py
(oidc-provider); tokens here need what that provider will not sign (expired, other
tenants' claims at the length limit)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec


class LocalIssuer:
    def __init__(self, url: str) -> None:
        self.url = url
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.kid = "local-1"
        self.fetches = 0

    def jwks(self) -> dict[str, Any]:
        public = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.key.public_key()))
        return {"keys": [{**public, "kid": self.kid, "use": "sig", "alg": "ES256"}]}

    def mint(self, resource: str, **claims: Any) -> str:
        """A token for `resource`, valid for 5 minutes unless `claims` say otherwise."""
        now = int(time.time())
        body = {
            "iss": self.url,
            "aud": resource,
            "sub": "agent:support-bot",
            "toolhub_tenant": "acme",
            "scope": "mcp",
            "iat": now,
            "exp": now + 300,
            **claims,
        }
        body = {name: value for name, value in body.items() if value is not None}
        return jwt.encode(body, self.key, algorithm="ES256", headers={"kid": self.kid})


@contextmanager
def local_issuer() -> Iterator[LocalIssuer]:
    holder: list[LocalIssuer] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            issuer = holder[0]
            if self.path == "/.well-known/openid-configuration":
                body: dict[str, Any] = {"issuer": issuer.url, "jwks_uri": f"{issuer.url}/jwks"}
            elif self.path == "/jwks":
                issuer.fetches += 1
                body = issuer.jwks()
            else:
                self.send_error(404)
                return
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    holder.append(LocalIssuer(f"http://127.0.0.1:{httpd.server_address[1]}"))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        httpd.shutdown()
        httpd.server_close()
