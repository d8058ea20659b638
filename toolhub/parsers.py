"""Request parsers (kept apart from toolhub.api: DRF imports them while loading APIView)."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions, parsers


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser; JSON nested too deeply to decode is a 400 too, not a 500."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError(
                "JSON parse error - the body is nested too deeply."
            ) from None
