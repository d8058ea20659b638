"""Compile pydantic models to the restricted JSON Schema subset tools may expose.

Providers and MCP clients handle a plain subset reliably: objects, arrays,
scalars, enums, bounds. Composition keywords (oneOf/anyOf/allOf/not/if-then-else),
patternProperties and references are refused (seed 000, invariant 10). Optional
fields compile to "not required" rather than `anyOf [T, null]`, and nested models
are inlined so no `$ref` is left.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

FORBIDDEN_KEYWORDS = frozenset(
    {
        "oneOf",
        "anyOf",
        "allOf",
        "not",
        "if",
        "then",
        "else",
        "patternProperties",
        "$ref",
        "$dynamicRef",
        "dependentSchemas",
        "unevaluatedProperties",
    }
)
RESERVED_PROPERTIES = frozenset({"connectionId"})


class SchemaError(ValueError):
    """A tool schema outside the supported subset."""


class _NullableAsOptional(GenerateJsonSchema):
    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])


def _inline_refs(node: Any, defs: dict[str, Any], seen: tuple[str, ...] = ()) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            name = ref.removeprefix("#/$defs/")
            if name in seen:
                raise SchemaError(f"recursive model {name!r} cannot be inlined")
            target = copy.deepcopy(defs[name])
            merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
            return _inline_refs(merged, defs, (*seen, name))
        return {k: _inline_refs(v, defs, seen) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline_refs(item, defs, seen) for item in node]
    return node


inline_refs = _inline_refs  # also used for imported MCP schemas (apps/mcp/schemas.py)


def _drop_noise(node: Any) -> Any:
    """Remove pydantic's generated titles and `default: null` (the key is simply optional)."""
    if isinstance(node, list):
        return [_drop_noise(item) for item in node]
    if not isinstance(node, dict):
        return node
    cleaned = {}
    for key, value in node.items():
        if key == "title" or (key == "default" and value is None):
            continue
        if key == "properties" and isinstance(value, dict):
            cleaned[key] = {name: _drop_noise(sub) for name, sub in value.items()}
        else:
            cleaned[key] = _drop_noise(value)
    return cleaned


def compile_model(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(schema_generator=_NullableAsOptional)
    schema: dict[str, Any] = _drop_noise(_inline_refs(raw, raw.get("$defs", {})))
    return schema


def check_input_schema(schema: dict[str, Any]) -> None:
    """Raise SchemaError unless `schema` is an object schema inside the subset."""
    if schema.get("type") != "object":
        raise SchemaError("an input schema must be a JSON object schema")
    _walk(schema, "$")
    _require_closed_objects(schema, "$")


def _require_closed_objects(node: Any, path: str) -> None:
    """Unknown keys are an error at every depth, not only at the top (nested models
    must subclass ToolParams too)."""
    if isinstance(node, list):
        for index, item in enumerate(node):
            _require_closed_objects(item, f"{path}[{index}]")
        return
    if not isinstance(node, dict):
        return
    is_object = node.get("type") == "object" and ("properties" in node or path == "$")
    if is_object and node.get("additionalProperties", True) is not False:
        raise SchemaError(f"{path} must forbid additional properties (extra keys)")
    for key, value in node.items():
        if key == "properties" and isinstance(value, dict):
            for name, sub in value.items():
                _require_closed_objects(sub, f"{path}.{name}")
        elif key in ("items", "prefixItems"):
            _require_closed_objects(value, f"{path}.{key}")


def check_output_schema(schema: dict[str, Any]) -> None:
    _walk(schema, "$", reserved=False)


def _walk(node: Any, path: str, reserved: bool = True) -> None:
    if isinstance(node, list):
        for index, item in enumerate(node):
            _walk(item, f"{path}[{index}]", reserved)
        return
    if not isinstance(node, dict):
        return
    bad = FORBIDDEN_KEYWORDS.intersection(node)
    if bad:
        raise SchemaError(
            f"{path} uses {', '.join(sorted(bad))}, outside the supported schema subset"
        )
    properties = node.get("properties")
    if isinstance(properties, dict):
        clash = RESERVED_PROPERTIES.intersection(properties) if reserved else set()
        if clash:
            raise SchemaError(
                f"{path} declares {', '.join(sorted(clash))}: connections travel in the "
                "invocation context, never in args (CONNECTION_ID_VIA_CONTEXT)"
            )
        for name, sub in properties.items():
            _walk(sub, f"{path}.{name}", reserved)
    for key in ("items", "additionalProperties", "prefixItems"):
        if key in node and not isinstance(node[key], bool):
            _walk(node[key], f"{path}.{key}", reserved)


def schema_hash(schema: dict[str, Any]) -> str:
    canonical = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
