"""Request parsers (kept apart from toolhub.web.api: DRF imports them while loading APIView)."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions, parsers

from toolhub.web import json_input


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser reading with toolhub.web.json_input: JSON that is not JSON, or that
    is nested too deeply or too large, is a 400 saying which, never a 500."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            return json_input.loads(stream.read())
        except json_input.JsonInputError as exc:
            raise exceptions.ParseError(str(exc)) from None
