"""A real OpenID provider for the tests: panva's oidc-provider (npm, pinned in
tests/identity/oidc/package.json) run with the machine's node.

    from tests.identity.provider import OpenIDProvider, oidc_provider  # the fixture

`oidc_provider` (module-scoped) starts one on a free port and waits for its discovery
document. Users, clients and resources live in a JSON file that the provider reads again
at every lookup, so a test changes them while it runs:

    oidc_provider.set_user("alice", "pw", groups=["toolhub-acme-admins"])
    oidc_provider.add_client("toolhub", "secret", redirect_uris=[f"{server}/oidc/callback/"])
    oidc_provider.add_resource(f"{server}/mcp/", scope="mcp", ttl=300)
    token = oidc_provider.access_token("alice", "pw", resource=f"{server}/mcp/")

`access_token` runs the whole authorization-code flow with PKCE through the provider's
login form (no browser), so the token is the provider's own: a JWT signed with the key in
its JWKS, `iss` the issuer, `aud` the resource, `sub` the user, plus the user's
`token_claims`. `client_token` does the same with client credentials (`sub` = client id,
plus the client's `token_claims`).
"""

from __future__ import annotations

import base64
import hashlib
import http.cookiejar
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import stop
from tests.support.server import free_port

HARNESS = Path(__file__).with_name("oidc")
# The client every fixture registers for minting tokens (authorization code + PKCE and
# client credentials). Its redirect URI is never served: the flow stops at the redirect.
TOKEN_CLIENT_ID = "test-token-client"
TOKEN_CLIENT_SECRET = "test-token-client-secret"
TOKEN_REDIRECT = "http://127.0.0.1:9/callback"


class ProviderError(RuntimeError):
    """The provider refused a step of a flow (its error page or error JSON)."""


def harness() -> Path:
    """The harness with its pinned packages installed: npm install on a fresh checkout,
    and again when package.json or package-lock.json is newer than node_modules."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} is not installed; the OpenID provider needs node 20+")
    installed = HARNESS / "node_modules" / ".package-lock.json"
    pinned = max((HARNESS / n).stat().st_mtime for n in ("package.json", "package-lock.json"))
    if not installed.is_file() or installed.stat().st_mtime < pinned:
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=HARNESS,
            check=True,
            capture_output=True,
            timeout=600,
        )
    return HARNESS


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _Form(HTMLParser):
    """The login form's action and the page's alert text."""

    def __init__(self) -> None:
        super().__init__()
        self.action: str | None = None
        self.alert = False
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "form":
            self.action = found.get("action")
        if found.get("role") == "alert" or tag in ("h1", "p"):
            self.alert = True

    def handle_data(self, data: str) -> None:
        if self.alert and data.strip():
            self.text.append(data.strip())


def _pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode()).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


class OpenIDProvider:
    """A running provider: `issuer` (http://127.0.0.1:PORT), its state file, its log."""

    def __init__(self, issuer: str, state_path: Path, log: Path) -> None:
        self.issuer = issuer
        self.state_path = state_path
        self.log = log

    # ------------------------------------------------------------------ state
    def state(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.state_path.read_text())
        return data

    def _write(self, data: dict[str, Any]) -> None:
        # Replaced in one step: the provider never reads a half-written file.
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.state_path)

    def set_user(
        self,
        login: str,
        password: str,
        token_claims: dict[str, Any] | None = None,
        **claims: Any,
    ) -> None:
        """Add or replace a user. `claims` go to the ID token and userinfo (groups=[...],
        email=..., name=...; any other name too); `token_claims` go into its JWT access
        tokens."""
        data = self.state()
        data["users"][login] = {
            "password": password,
            "claims": claims,
            "token_claims": token_claims or {},
        }
        self._write(data)

    def remove_user(self, login: str) -> None:
        data = self.state()
        data["users"].pop(login, None)
        self._write(data)

    def add_client(
        self,
        client_id: str,
        client_secret: str | None,
        redirect_uris: list[str],
        post_logout_redirect_uris: list[str] | None = None,
        grant_types: list[str] | None = None,
        token_claims: dict[str, Any] | None = None,
        **metadata: Any,
    ) -> None:
        """Register (or replace) a client. `client_secret=None` makes a public client
        (token_endpoint_auth_method none, PKCE required)."""
        client: dict[str, Any] = {
            "client_id": client_id,
            "redirect_uris": redirect_uris,
            "post_logout_redirect_uris": post_logout_redirect_uris or [],
            "grant_types": grant_types or ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_claims": token_claims or {},
            **metadata,
        }
        if client_secret is None:
            client["token_endpoint_auth_method"] = "none"
        else:
            client["client_secret"] = client_secret
        data = self.state()
        data["clients"] = [c for c in data["clients"] if c["client_id"] != client_id]
        data["clients"].append(client)
        self._write(data)

    def add_resource(self, resource: str, scope: str = "mcp", ttl: int = 300) -> None:
        """A resource server (RFC 8707): tokens for it are JWTs with aud = `resource`,
        valid for `ttl` seconds, carrying at most the scopes in `scope`."""
        data = self.state()
        data["resources"][resource] = {"scope": scope, "ttl": ttl}
        self._write(data)

    # ------------------------------------------------------------------ reads
    def discovery(self) -> dict[str, Any]:
        return self._get_json("/.well-known/openid-configuration")

    def jwks(self) -> dict[str, Any]:
        return self._get_json("/jwks")

    def _get_json(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.issuer}{path}", timeout=10) as response:
            data: dict[str, Any] = json.load(response)
            return data

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    # ------------------------------------------------------------------ tokens
    def _token_request(self, client_id: str, secret: str | None, form: dict[str, str]) -> Any:
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        if secret is None:
            form = {**form, "client_id": client_id}
        else:
            basic = f"{urllib.parse.quote(client_id)}:{urllib.parse.quote(secret)}"
            headers["Authorization"] = "Basic " + base64.b64encode(basic.encode()).decode()
        request = urllib.request.Request(
            f"{self.issuer}/token",
            data=urllib.parse.urlencode(form).encode(),
            headers=headers,
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            raise ProviderError(error.read().decode(errors="replace")) from None

    def client_token(
        self,
        resource: str,
        scope: str = "mcp",
        client_id: str = TOKEN_CLIENT_ID,
        client_secret: str = TOKEN_CLIENT_SECRET,
    ) -> str:
        """An access token by client credentials: sub = the client id, aud = resource."""
        body = self._token_request(
            client_id,
            client_secret,
            {"grant_type": "client_credentials", "resource": resource, "scope": scope},
        )
        return str(body["access_token"])

    def authorize(
        self,
        login: str,
        password: str,
        scope: str = "openid",
        resource: str | None = None,
        client_id: str = TOKEN_CLIENT_ID,
        client_secret: str | None = TOKEN_CLIENT_SECRET,
        redirect_uri: str = TOKEN_REDIRECT,
    ) -> dict[str, Any]:
        """The authorization-code flow with PKCE through the login form: the token
        response (access_token, id_token, refresh_token if offline_access, ...). Raises
        ProviderError with the provider's message when a step is refused."""
        verifier, challenge = _pkce()
        state = secrets.token_urlsafe(16)
        query = {
            "response_type": "code",
            "client_id": client_id,
            "redirect_uri": redirect_uri,
            "scope": scope,
            "state": state,
            "nonce": secrets.token_urlsafe(16),
            "code_challenge": challenge,
            "code_challenge_method": "S256",
            "prompt": "login consent" if "offline_access" in scope else "login",
        }
        if resource:
            query["resource"] = resource
        url = self.follow(
            f"{self.issuer}/auth?{urllib.parse.urlencode(query)}", login, password, redirect_uri
        )
        params = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
        if "error" in params:
            raise ProviderError(f"{params['error']}: {params.get('error_description', '')}")
        if params.get("state") != state or params.get("iss") != self.issuer:
            raise ProviderError(f"unexpected authorization response {params}")
        form_body = {
            "grant_type": "authorization_code",
            "code": params["code"],
            "redirect_uri": redirect_uri,
            "code_verifier": verifier,
        }
        if resource:
            form_body["resource"] = resource
        response: dict[str, Any] = self._token_request(client_id, client_secret, form_body)
        return response

    def follow(
        self,
        url: str,
        login: str | None,
        password: str | None,
        until: str,
        jar: http.cookiejar.CookieJar | None = None,
    ) -> str:
        """Follow an authorization request through the provider (its login form, filled
        with login and password when it shows; its consent, given) until it redirects to
        a URL starting with `until`; that URL. `jar` keeps the provider's session between
        calls, as a browser's cookies do. ProviderError when the provider stops on a page
        (a wrong password, an error)."""
        opener = urllib.request.build_opener(
            _NoRedirect(),
            urllib.request.HTTPCookieProcessor(
                jar if jar is not None else http.cookiejar.CookieJar()
            ),
        )
        data: bytes | None = None
        for _ in range(10):
            try:
                with opener.open(urllib.request.Request(url, data=data), timeout=10) as page:
                    body = page.read().decode(errors="replace")
            except urllib.error.HTTPError as error:
                if error.code not in (302, 303):
                    raise ProviderError(error.read().decode(errors="replace")) from None
                url = urllib.parse.urljoin(url, error.headers["Location"])
                data = None
                if url.startswith(until):
                    return url
                continue
            form = _Form()
            form.feed(body)
            if form.action is None or data is not None or login is None:
                raise ProviderError(" ".join(form.text) or body[:500])
            url = urllib.parse.urljoin(url, form.action)
            data = urllib.parse.urlencode({"login": login, "password": password or ""}).encode()
        raise ProviderError(f"the flow did not come back to {until}")

    def access_token(
        self, login: str, password: str, resource: str, scope: str = "openid mcp", **kw: Any
    ) -> str:
        """A user's JWT access token for `resource` (aud), through the login form."""
        return str(self.authorize(login, password, scope, resource, **kw)["access_token"])


@contextmanager
def openid_provider() -> Iterator[OpenIDProvider]:
    """Start oidc-provider on a free port with the token client registered; stop it after."""
    folder = Path(tempfile.mkdtemp(prefix="oidc-provider-"))
    state_path = folder / "state.json"
    state_path.write_text(json.dumps({"clients": [], "users": {}, "resources": {}}))
    port = free_port()
    provider = OpenIDProvider(f"http://127.0.0.1:{port}", state_path, folder / "provider.log")
    provider.add_client(
        TOKEN_CLIENT_ID,
        TOKEN_CLIENT_SECRET,
        redirect_uris=[TOKEN_REDIRECT],
        grant_types=["authorization_code", "refresh_token", "client_credentials"],
    )
    env = {**os.environ, "NODE_NO_WARNINGS": "1"}
    with provider.log.open("wb") as output:
        process = subprocess.Popen(
            ["node", str(harness() / "provider.mjs"), str(port), str(state_path)],
            cwd=HARNESS,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"oidc-provider exited: {provider.output()}")
            try:
                if provider.discovery()["issuer"] == provider.issuer:
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"oidc-provider did not come up: {provider.output()}"
                    ) from None
                time.sleep(0.1)
        yield provider
    finally:
        stop(process)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def oidc_provider() -> Iterator[OpenIDProvider]:
    """One provider per test module (import this fixture where you need it)."""
    with openid_provider() as provider:
        yield provider
