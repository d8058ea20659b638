"""MaskPii: personal data out of tool results before anyone sees them.

An after_result hook: every string in the result (keys left alone) has its e-mail
addresses, payment card numbers (13-19 digits that pass the Luhn check, spaces or dashes
allowed) and, if asked, phone numbers replaced by a placeholder, before redaction and
recording. The masked result is validated against the tool's output again: a field
whose schema forbids the placeholder (a pattern, a maximum length) ends the call as
output_invalid naming this hook, rather than leaking the value.

    {"hook": "apps.invocations.hooks.mask_pii.MaskPii",
     "tools": ["mcp__crm__*"],
     "options": {"kinds": ["email", "card", "phone"]}}
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any

from apps.invocations.hooks import Hook, HookCall

KINDS = ("email", "card", "phone")
_PATTERNS = {
    "email": re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"),
    "card": re.compile(r"(?<!\d)(?:\d[ -]?){12,18}\d(?!\d)"),
    "phone": re.compile(r"(?<![\w+])\+?\d[\d ().-]{6,}\d(?!\w)"),
}


def _luhn(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char)
        if index % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


class MaskPii(Hook):
    def __init__(self, kinds: list[str] | None = None, placeholder: str = "[{kind}]") -> None:
        chosen = list(kinds) if kinds is not None else ["email", "card"]
        unknown = sorted(set(chosen) - set(KINDS))
        if unknown or not chosen:
            raise ValueError(f"kinds must be some of {', '.join(KINDS)}; got {chosen}")
        if not placeholder:
            raise ValueError("placeholder must not be empty")
        self.kinds = [kind for kind in KINDS if kind in chosen]  # cards before phones
        self.placeholder = placeholder

    def after_result(self, call: HookCall) -> None:
        call.result = self._masked(call.result)

    def _masked(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._text(value)
        if isinstance(value, list):
            return [self._masked(item) for item in value]
        if isinstance(value, dict):
            return {key: self._masked(item) for key, item in value.items()}
        return value

    def _text(self, text: str) -> str:
        for kind in self.kinds:
            text = _PATTERNS[kind].sub(partial(self._replace, kind), text)
        return text

    def _replace(self, kind: str, match: re.Match[str]) -> str:
        if kind == "card" and not _luhn(re.sub(r"\D", "", match.group())):
            return match.group()
        return self.placeholder.format(kind=kind)
