"""Validating an imported tool's arguments: µs per call, jsonschema-rs against `jsonschema`.

    .venv/bin/python bench/mcp_schemas.py [--number 20000]

Three schemas as servers declare them: mcp-server-git's `git_log` (optional arguments as
anyOf [string, null]), a FastMCP tool with nested models, a list of them, an enum and
dict[str, int] ($defs and $ref), and hand-written keywords (const, prefixItems,
patternProperties, oneOf, definitions). For each: the validator toolhub compiles
(apps/mcp/schemas.py `compiled`, jsonschema-rs) checking valid arguments, the whole
McpParams step the runner takes (model_validate_json, then model_dump), and the
pure-Python `jsonschema` package (a dev dependency) for comparison. Prints the best of
five repeats per line. Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import timeit
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GIT_LOG = {
    "type": "object",
    "title": "logArguments",
    "properties": {
        "repo_path": {"title": "Repo Path", "type": "string"},
        "max_count": {"default": 10, "title": "Max Count", "type": "integer"},
        "start_timestamp": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        "end_timestamp": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
    },
    "required": ["repo_path"],
}
ORDER = {
    "type": "object",
    "properties": {
        "customer": {"type": "string"},
        "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
        "ship_to": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}], "default": None},
        "colour": {"$ref": "#/$defs/Colour", "default": "red"},
        "speed": {"enum": ["slow", "fast"], "type": "string", "default": "slow"},
        "counts": {
            "anyOf": [
                {"type": "object", "additionalProperties": {"type": "integer"}},
                {"type": "null"},
            ]
        },
    },
    "required": ["customer", "items"],
    "$defs": {
        "Address": {
            "type": "object",
            "properties": {
                "street": {"type": "string"},
                "city": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
            },
            "required": ["street"],
        },
        "Colour": {"enum": ["red", "green"], "type": "string"},
        "Item": {
            "type": "object",
            "properties": {
                "sku": {"type": "string", "pattern": "^[A-Z]{3}-\\d+$"},
                "quantity": {"type": "integer", "minimum": 1, "maximum": 100},
            },
            "required": ["sku", "quantity"],
        },
    },
}
TAGGED = {
    "type": "object",
    "properties": {
        "kind": {"const": "point"},
        "at": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}]},
        "labels": {"type": "object", "patternProperties": {"^x-": {"type": "string"}}},
        "size": {"oneOf": [{"type": "integer"}, {"$ref": "#/definitions/Named"}]},
    },
    "required": ["kind", "at"],
    "definitions": {"Named": {"enum": ["small", "large"]}},
}
CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("git_log", GIT_LOG, {"repo_path": "/srv/repo", "max_count": 5, "start_timestamp": None}),
    (
        "fastmcp order",
        ORDER,
        {
            "customer": "ada",
            "items": [{"sku": "ABC-1", "quantity": 2}, {"sku": "XYZ-22", "quantity": 1}],
            "ship_to": {"street": "1 Main St", "city": None},
            "colour": "green",
            "counts": {"apples": 3},
        },
    ),
    ("keywords", TAGGED, {"kind": "point", "at": [1, 2.5], "labels": {"x-a": "b"}, "size": 3}),
]


def list_errors(validator: Any, arguments: dict[str, Any]) -> list[Any]:
    return list(validator.iter_errors(arguments))


def runner_step(params: Any, encoded: str) -> dict[str, Any]:
    """What the runner does with a call's arguments (apps/invocations/runner.py step 5)."""
    return params.model_validate_json(encoded, strict=True).model_dump(mode="json")


def best_us(action: Callable[[], object], number: int) -> float:
    return min(timeit.repeat(action, number=number, repeat=5)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20000, help="calls per repeat")
    number = parser.parse_args().number
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolhub.settings")
    os.environ.setdefault("TOOLHUB_SECRET_KEY", "bench-only-" + "x" * 40)
    import django

    django.setup()
    import jsonschema

    from apps.mcp.schemas import compile_params, compiled

    sys.stdout.write(f"{'schema':14} {'what':34} {'µs/call':>8}\n")
    for name, schema, arguments in CASES:
        params = compile_params(schema, "bench")
        assert params.declared_schema is not None
        validator = compiled(params.declared_schema)
        encoded = json.dumps(arguments)
        python = jsonschema.Draft202012Validator(schema)
        assert validator.is_valid(arguments) and python.is_valid(arguments)
        lines: list[tuple[str, Callable[[], object]]] = [
            ("jsonschema-rs is_valid", partial(validator.is_valid, arguments)),
            ("jsonschema-rs iter_errors", partial(list_errors, validator, arguments)),
            ("McpParams validate_json + dump", partial(runner_step, params, encoded)),
            ("jsonschema (pure Python) is_valid", partial(python.is_valid, arguments)),
        ]
        for what, action in lines:
            sys.stdout.write(f"{name:14} {what:34} {best_us(action, number):8.2f}\n")


if __name__ == "__main__":
    main()
