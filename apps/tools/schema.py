"""Compile pydantic models to the restricted JSON Schema subset tools may expose.

Providers and MCP clients handle a plain subset reliably: objects, arrays,
scalars, enums, bounds. Composition keywords (oneOf/anyOf/allOf/not/if-then-else),
patternProperties and references are refused (seed 000, invariant 10). Optional
fields compile to "not required" rather than `anyOf [T, null]`, and nested models
are inlined so no `$ref` is left.

That subset is for the tools toolhub writes. An imported tool's schema is the one its
server declares (JSON Schema 2020-12, validated as such: apps/mcp/schemas.py); the rules
here that still hold for it are check_declared_input_schema's: an object at the root, no
`connectionId`, no reference outside the schema (nothing is ever fetched), bounded size
and depth.
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
# A declared (imported) schema: at most this large as compact JSON, and this deeply nested.
MAX_DECLARED_BYTES = 64 * 1024
MAX_DECLARED_DEPTH = 32
_REFERENCES = ("$ref", "$dynamicRef", "$recursiveRef")
_SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
_DATA = frozenset({"const", "enum", "default", "examples"})  # JSON values, not schemas


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


def check_declared_input_schema(schema: Any) -> None:
    """Raise SchemaError unless a schema declared in JSON Schema (not compiled from a
    model) may be listed and validated as it is: an object schema, at most
    MAX_DECLARED_BYTES and MAX_DECLARED_DEPTH, with no `connectionId` property
    (CONNECTION_ID_VIA_CONTEXT) and no reference outside itself (`$ref` must start with
    `#`: toolhub never fetches a schema). The keywords themselves are the validator's."""
    if not isinstance(schema, dict):
        raise SchemaError("the input schema is not a JSON object")
    if schema.get("type") != "object":
        raise SchemaError(
            f"the input schema's type is {json.dumps(schema.get('type'))}: tool arguments "
            'are a JSON object, so it must be "object"'
        )
    _walk_declared(schema, "$", 0)
    size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_DECLARED_BYTES:
        raise SchemaError(
            f"the input schema is {size} bytes as JSON; the limit is {MAX_DECLARED_BYTES}"
        )


def _walk_declared(node: Any, path: str, depth: int) -> None:
    if depth > MAX_DECLARED_DEPTH:
        raise SchemaError(f"{path} is nested more than {MAX_DECLARED_DEPTH} levels deep")
    if isinstance(node, list):
        for index, item in enumerate(node):
            _walk_declared(item, f"{path}[{index}]", depth + 1)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        where = f"{path}.{key}"
        if key in _DATA:
            continue
        if key in _REFERENCES:
            if not isinstance(value, str) or not value.startswith("#"):
                raise SchemaError(
                    f"{where} is {json.dumps(value)[:100]}: only references inside the "
                    "schema (starting with #) are followed; toolhub never fetches a schema"
                )
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            if key == "properties":
                _refuse_reserved(value, where)
            for name, sub in value.items():  # names, then schemas: names are no keywords
                _walk_declared(sub, f"{where}.{name}", depth + 2)
        elif key == "required" and isinstance(value, list):
            _refuse_reserved(value, where)
        else:
            _walk_declared(value, where, depth + 1)


def _refuse_reserved(names: dict[str, Any] | list[Any], where: str) -> None:
    clash = RESERVED_PROPERTIES.intersection(name for name in names if isinstance(name, str))
    if clash:
        raise SchemaError(
            f"{where} declares {', '.join(sorted(clash))}: connections travel in the "
            "invocation context, never in args (CONNECTION_ID_VIA_CONTEXT)"
        )


def schema_hash(schema: dict[str, Any]) -> str:
    canonical = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def example_arguments(schema: dict[str, Any], depth: int = 0) -> Any:
    """A template of arguments a person fills in: the schema's required properties (all of
    them when it requires none), each with its default, first example or enum value, or
    an empty value of its type. For forms (the demo chat), never for validation."""
    if not isinstance(schema, dict) or depth > 6:
        return None
    for key in ("default", "const"):
        if key in schema:
            return schema[key]
    if schema.get("examples"):
        return schema["examples"][0]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            options = [o for o in schema[key] if isinstance(o, dict) and o.get("type") != "null"]
            return example_arguments(options[0] if options else {}, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties") or {}
        wanted = schema.get("required") or list(properties)
        return {
            name: example_arguments(properties.get(name, {}), depth + 1)
            for name in wanted
            if name in properties
        }
    if kind == "array":
        item = example_arguments(schema.get("items") or {}, depth + 1)
        return [] if item is None else [item]
    return {"string": "", "integer": 0, "number": 0, "boolean": False}.get(str(kind))
