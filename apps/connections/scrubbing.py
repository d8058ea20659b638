"""Scrubbing a connection's secrets out of what a tool returns (SECRETS_NEVER_ECHOED).

A target that echoes request headers (httpbin's /headers, a debugging endpoint, an
error page quoting the request) would hand the credential the broker attached back
to the model, and into the record and the run events. The runner therefore passes
every tool output of a call that used a connection through the connection's
`Scrubber`, which replaces each secret, in the forms it usually travels in, by
`[redacted]`.

Forms, matched without regard to case (a host name comes back lower-cased): the
raw value; URL-encoded (`%XX`, and `+` for spaces); JSON-escaped; HTML-escaped;
base64 (standard and URL-safe, padded or not) of the value and of `user:password`;
and the stable middle of the base64 of the value at each of the three byte
alignments, which is what any longer base64 text holding the value contains, also
for the base64 of its base64 (an echo encoding a "Basic ..." header). A "Bearer ..."
or "Basic ..." header holds one of these forms.

Values shorter than MIN_SECRET_LENGTH are not scrubbed: replacing a 4-letter string
wherever it occurs would mangle ordinary output. `Connection.set_secret` refuses such
values, so only a secret stored before that rule can be that short.
"""

from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, quote_plus

REDACTED = "[redacted]"
MIN_SECRET_LENGTH = 8
PARTIAL_PREFIX = 4


def _base64_forms(raw: bytes) -> set[str]:
    forms = set()
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        whole = encode(raw).decode()
        forms |= {whole, whole.rstrip("=")}
        # Inside longer base64 text the value starts at byte 0, 1 or 2 of a 3-byte
        # group: keep only the characters no neighbouring byte shapes (the first
        # offset+1 characters mix in the bytes before, the last partial one those after).
        for offset in (0, 1, 2):
            text = encode(b"\0" * offset + raw).decode().rstrip("=")
            head = offset + 1 if offset else 0
            tail = 1 if (offset + len(raw)) % 3 else 0
            forms.add(text[head : len(text) - tail])
    return forms


def secret_forms(values: Iterable[str], pairs: Iterable[tuple[str, str]] = ()) -> set[str]:
    """Every form of each secret value, and of each `user:password` pair, worth scrubbing."""
    forms: set[str] = set()
    texts = [value for value in values if len(value) >= MIN_SECRET_LENGTH]
    texts += [
        f"{user}:{password}" for user, password in pairs if len(password) >= MIN_SECRET_LENGTH
    ]
    for text in texts:
        json_forms = {json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1]}
        forms |= {text, html.escape(text), quote(text, safe=""), quote_plus(text, safe="")}
        forms |= json_forms | {form.replace("/", "\\/") for form in json_forms}  # PHP's "\/"
        forms |= _base64_forms(text.encode())
        # A "Basic" header is base64 already: an echo that base64-encodes it nests it.
        forms |= _base64_forms(base64.b64encode(text.encode()))
    return {form for form in forms if len(form) >= MIN_SECRET_LENGTH}


class Scrubber:
    """Replaces secret forms in every string of a JSON-like value, keys included."""

    def __init__(self, forms: Iterable[str]) -> None:
        ordered = sorted(set(forms), key=len, reverse=True)  # the longest form wins
        self._forms = [form.lower() for form in ordered]
        # Case-blind: a host name, or a header a target normalises, comes back folded.
        alternatives = "|".join(map(re.escape, ordered))
        self._pattern = re.compile(alternatives, re.IGNORECASE) if ordered else None

    def __repr__(self) -> str:
        return "<Scrubber>"  # never the secrets

    def __or__(self, other: Scrubber) -> Scrubber:
        """Both scrubbers' secrets: a call that sent more than one credential."""
        return Scrubber([*self._forms, *other._forms])

    def text(self, value: str) -> str:
        return self._pattern.sub(REDACTED, value) if self._pattern else value

    def cut_tail(self, text: str) -> str:
        """A text cut short may end inside a secret: its start goes too (a target could
        pad the echo to choose where the cut falls). Prefixes under 4 characters stay."""
        folded = text.lower()
        for form in self._forms:
            for length in range(len(form) - 1, PARTIAL_PREFIX - 1, -1):
                if folded.endswith(form[:length]):
                    return text[: len(text) - length] + REDACTED
        return text

    def scrub(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.scrub(key): self.scrub(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self.scrub(item) for item in value]
        return value
