"""An imported tool's arguments, validated with the JSON Schema its server declares.

Servers written with pydantic, FastMCP or zod declare what JSON Schema 2020-12 allows:
`anyOf [X, {"type": "null"}]` for an optional argument, `$ref` into `$defs` or
`definitions`, `const`, `prefixItems`, `patternProperties`... Translating that into the
pydantic subset built-in tools use (apps/tools/schema.py) refused most of it, and made
3 of mcp-server-git's 12 tools unusable. So the schema is not translated: it is compiled,
once per distinct schema (a bounded cache keyed by its hash), by jsonschema-rs, a Rust
implementation of JSON Schema (2020-12 by default; a `$schema` naming an earlier draft is
honoured). bench/mcp_schemas.py measures 0.5-3 µs per validation of mcp-server-git's
`git_log` arguments, of a FastMCP schema with nested models and references, and of
hand-written keywords (the pure-Python `jsonschema` package: 60-800 µs for the same), and
12-30 µs for the whole step the runner takes (parse, validate, dump) on a busy 2-core
machine.

The runner still sees a pydantic model (McpParams): it validates the raw arguments with
the compiled schema, raises a pydantic ValidationError with one error per failing value,
at that value's path and without the value (the validator masks it), and dumps the
arguments exactly as the agent sent them, an explicit null included.

What toolhub changes in a declared schema (accepted_schema), and why:
- the root's `type` becomes "object" when it is absent (the empty schema `{}`) or a list
  that includes it: arguments are always a JSON object, and MCP clients require that root
  type (toolhub serves the schema again from /mcp/);
- a root that declares `properties` and says nothing about other keys (no
  `additionalProperties`, `patternProperties`, `unevaluatedProperties` or composition)
  gets `additionalProperties: false`, as before: a misspelt argument is an error the agent
  sees rather than a key the server ignores, and a server is never sent an argument its
  admin did not read. Nested objects keep JSON Schema's meaning.
`format` is an annotation, as 2020-12 says, in every draft: the server checks its own
formats (a pydantic `datetime` accepts "2024-01-15T14:30:25", which RFC 3339 refuses).
A schema that breaks apps/tools/schema.py's check_declared_input_schema, or that the
validator cannot compile (a `$ref` to nothing, an invalid `pattern`, an unknown
`$schema`), raises SchemaError: the tool is imported unusable with that reason.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from typing import Any, ClassVar

import jsonschema_rs
from pydantic import (
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationError,
    model_serializer,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from apps.tools.contracts import ToolParams
from apps.tools.schema import SchemaError, check_declared_input_schema

MASK = "the value"  # what a validation message says instead of the agent's value
MAX_ERRORS = 20  # per call: the runner shows five and counts the rest
MAX_BRANCHES = 3  # alternatives of an anyOf/oneOf named in its message
CACHE_SIZE = 512  # compiled schemas kept, least recently used dropped
_COMPOSITION = (
    *("allOf", "anyOf", "oneOf", "not", "if", "then", "else"),
    *("$ref", "$dynamicRef", "dependentSchemas"),
)
_OPEN = ("additionalProperties", "patternProperties", "unevaluatedProperties")


class McpParams(ToolParams):
    """Imported arguments: checked against the declared schema, kept exactly as sent."""

    declared_schema: ClassVar[dict[str, Any] | None] = None
    _validator: ClassVar[jsonschema_rs.Validator]
    _arguments: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _check_with_the_declared_schema(
        cls, data: Any, handler: ModelWrapValidatorHandler[McpParams]
    ) -> McpParams:
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise ValidationError.from_exception_data(
                cls.__name__, [_problem((), "the arguments must be a JSON object")]
            )
        if not cls._validator.is_valid(data):  # the common case stops at the first check
            problems = describe_errors(cls._validator, data)
            raise ValidationError.from_exception_data(cls.__name__, problems)
        params = handler({})  # no fields: an empty instance, cheaper than model_construct
        params.__pydantic_private__["_arguments"] = data  # type: ignore[index]
        return params

    @model_serializer(mode="plain")
    def _as_sent(self) -> dict[str, Any]:
        return self._arguments  # pydantic serialises it into new dicts and lists


def compile_params(schema: Any, title: str) -> type[McpParams]:
    """The params model of a tool declaring `schema`; raises SchemaError with the reason."""
    accepted = accepted_schema(schema)
    check_declared_input_schema(accepted)
    validator = compiled(accepted)
    return type(
        title,
        (McpParams,),
        {"declared_schema": accepted, "_validator": validator, "__module__": __name__},
    )


def accepted_schema(schema: Any) -> dict[str, Any]:
    """The declared schema as toolhub lists and validates it (see the module docstring)."""
    if not isinstance(schema, dict):
        raise SchemaError("the input schema is not a JSON object")
    accepted = dict(schema)
    kind = accepted.get("type")
    if kind is None or (isinstance(kind, list) and "object" in kind):
        accepted["type"] = "object"
    says_nothing_of_other_keys = not any(key in accepted for key in (*_OPEN, *_COMPOSITION))
    if "properties" in accepted and says_nothing_of_other_keys:
        accepted["additionalProperties"] = False
    return accepted


def declared_names(schema: dict[str, Any]) -> list[str]:
    """The top-level argument names a schema declares (what records may keep)."""
    properties = schema.get("properties")
    return (
        [name for name in properties if isinstance(name, str)]
        if isinstance(properties, dict)
        else []
    )


_cache: OrderedDict[str, jsonschema_rs.Validator] = OrderedDict()
_cache_lock = threading.Lock()


def compiled(schema: dict[str, Any]) -> jsonschema_rs.Validator:
    """The validator of `schema`, compiled once while it stays among the last CACHE_SIZE."""
    canonical = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    key = hashlib.sha256(canonical.encode()).hexdigest()
    with _cache_lock:
        validator = _cache.get(key)
        if validator is not None:
            _cache.move_to_end(key)
            return validator
    validator = _compile(schema)
    with _cache_lock:
        _cache[key] = validator
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return validator


def _compile(schema: dict[str, Any]) -> jsonschema_rs.Validator:
    try:
        return jsonschema_rs.validator_for(
            schema,
            validate_formats=False,
            mask=MASK,
            offline=True,  # never fetch: check_declared_input_schema refuses remote $refs too
        )
    except jsonschema_rs.ValidationError as exc:
        raise SchemaError(_compile_reason(exc, schema)) from None
    except Exception as exc:  # the reason is the validator's own words, for the admin
        first = str(exc).strip().splitlines()[:1]
        raise SchemaError(first[0] if first else type(exc).__name__) from None


def _compile_reason(exc: jsonschema_rs.ValidationError, schema: dict[str, Any]) -> str:
    """The validator's first line, at the place in the schema, with the schema's value
    (not secret: it is the declared schema) where the validator wrote the mask."""
    message = str(exc.message).strip().splitlines()[0]
    path = list(exc.instance_path)
    if not path:
        return message
    node: Any = schema
    for part in path:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            break
    else:
        if len(path) > 1 and path[-2] == "patternProperties":
            node = path[-1]  # the faulty regex is the key itself
        message = message.replace(MASK, json.dumps(node, ensure_ascii=False)[:100], 1)
    return f"{pointer(path)}: {message}"


def pointer(path: list[str | int] | tuple[str | int, ...]) -> str:
    return "$" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path)


def describe_errors(validator: jsonschema_rs.Validator, arguments: Any) -> list[InitErrorDetails]:
    """Each failing value as a pydantic line error: its path as `loc`, no input."""
    problems: list[InitErrorDetails] = []
    for error in validator.iter_errors(arguments):
        problems += _line_errors(error)
        if len(problems) >= MAX_ERRORS:
            break
    return problems[:MAX_ERRORS]


def _line_errors(error: jsonschema_rs.ValidationError) -> list[InitErrorDetails]:
    path = tuple(error.instance_path)
    kind = error.kind
    if isinstance(kind, jsonschema_rs.ValidationErrorKind.Required):
        return [_problem((*path, kind.property), "is required")]
    if isinstance(kind, jsonschema_rs.ValidationErrorKind.AdditionalProperties):
        reason = "is not an argument the schema declares (additionalProperties is false)"
        return [_problem((*path, name), reason) for name in kind.unexpected]
    if isinstance(kind, jsonschema_rs.ValidationErrorKind.UnevaluatedProperties):
        reason = "is not an argument the schema declares (unevaluatedProperties is false)"
        return [_problem((*path, name), reason) for name in kind.unexpected]
    message = str(error.message)
    alternatives = getattr(kind, "context", None)  # anyOf, oneOf: why each one failed
    if alternatives:
        reasons = [str(branch[0].message) for branch in alternatives[:MAX_BRANCHES] if branch]
        more = "; ..." if len(alternatives) > MAX_BRANCHES else ""
        message = f"{message} ({'; '.join(dict.fromkeys(reasons))}{more})"
    return [_problem(path, message)]


def _problem(loc: tuple[str | int, ...], message: str) -> InitErrorDetails:
    return InitErrorDetails(
        type=PydanticCustomError("json_schema", "{reason}", {"reason": message}),
        loc=loc,
        input=None,
    )
