"""The WebSocket protocol, for developers: docs/asyncapi.yaml, served as it is and as a page.

The YAML is the one source; /api/docs/websockets/ renders it (channels, authentication,
every message with its fields and an example, close codes), and the OpenAPI document's
description links there. tests/console/test_websocket_docs.py checks real messages and
close codes against it.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

DOCUMENT = Path(settings.BASE_DIR) / "docs" / "asyncapi.yaml"


@functools.cache
def asyncapi() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(DOCUMENT.read_text(encoding="utf-8"))
    return loaded


def asyncapi_yaml(request: HttpRequest) -> HttpResponse:
    return HttpResponse(DOCUMENT.read_bytes(), content_type="application/yaml; charset=utf-8")


def websocket_protocol(request: HttpRequest) -> HttpResponse:
    document = asyncapi()
    components = document["components"]
    # Not `messages`: base.html shows the flash messages under that name.
    message_docs = [
        {
            "key": key,
            "name": message["name"],
            "title": message.get("title", ""),
            "description": message.get("description", ""),
            "fields": _fields(components["schemas"], message["payload"]),
            "examples": [
                {"name": ex["name"], "json": json.dumps(ex["payload"], indent=2)}
                for ex in message.get("examples", [])
            ],
            "channels": [
                name
                for name, channel in document["channels"].items()
                if key in channel.get("messages", {})
            ],
        }
        for key, message in components["messages"].items()
    ]
    context = {
        "info": document["info"],
        "channels": document["channels"],
        "security": components["securitySchemes"],
        "message_docs": message_docs,
        "close_codes": document["x-close-codes"],
    }
    return render(request, "api/websockets.html", context)


def _fields(schemas: dict[str, Any], payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The payload's fields, envelope first, each with its type and description."""
    schema = schemas[payload["$ref"].split("/")[-1]]
    envelope = schemas["envelope"]
    required = set(schema.get("required", [])) | set(envelope["required"])
    fields = []
    for name, spec in schema["properties"].items():
        spec = spec or envelope["properties"].get(name, {})
        kind = spec.get("type") or (
            "const " + json.dumps(spec["const"]) if "const" in spec else "any JSON"
        )
        if isinstance(kind, list):
            kind = " or ".join(kind)
        if "enum" in spec:
            kind = " | ".join(spec["enum"])
        fields.append(
            {
                "name": name,
                "type": kind,
                "required": name in required,
                "description": spec.get("description", ""),
            }
        )
    return fields
