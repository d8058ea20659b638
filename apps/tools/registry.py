"""The in-code tool registry: contracts checked once, at registration.

A contract that breaks a rule (bad name, missing redaction, schema outside the
subset, a `connectionId` arg, a duplicate id) is refused loudly at start-up, so a
broken tool never reaches the catalog.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any

from apps.tools import call_settings
from apps.tools.capabilities import NEVER_WAIT, Capabilities
from apps.tools.contracts import CONSEQUENCE_LEVELS, EFFECTS, ToolContract, ToolParams
from apps.tools.redaction import PathTree, RedactionError, build_tree, check_paths
from apps.tools.schema import (
    SchemaError,
    check_declared_input_schema,
    check_input_schema,
    check_output_schema,
    compile_model,
    schema_hash,
)

# Every id is also a valid OpenAI and Anthropic tool name (API.md): `^[a-z0-9_]{1,64}$`,
# namespace included. A contract is refused, never renamed: its id is what policies,
# grants and records name. (Imported MCP names are mapped instead: apps/mcp/discovery.py.)
ID_RE = re.compile(r"^[a-z0-9_]{1,64}$")
MAX_ID = 64
NAME_RE = re.compile(r"^[a-z0-9_]+$")
NAMESPACE_RE = re.compile(r"^[a-z0-9]{1,32}$")  # no "_": "__" must split id parts unambiguously
KNOWN_CAPABILITIES = frozenset(Capabilities.__dataclass_fields__)


class ToolRegistrationError(Exception):
    pass


@dataclass(frozen=True)
class RegisteredTool:
    """A checked contract with its compiled schemas and redaction trees."""

    contract: ToolContract
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    schema_hash: str
    result_tree: PathTree
    args_tree: PathTree

    @property
    def id(self) -> str:
        return self.contract.id


def check_contract(contract: ToolContract) -> RegisteredTool:
    def refuse(reason: str) -> ToolRegistrationError:
        return ToolRegistrationError(f"tool {contract.namespace}__{contract.name}: {reason}")

    # fullmatch: `$` alone would also accept a trailing newline.
    if not NAME_RE.fullmatch(contract.name):
        raise refuse(
            "name must match ^[a-z0-9_]+$ (lower case letters, digits and _: no upper case, "
            "no -), so that the id is a valid OpenAI and Anthropic tool name"
        )
    if not NAMESPACE_RE.fullmatch(contract.namespace):
        raise refuse("namespace must match ^[a-z0-9]{1,32}$ (no _ and no -)")
    if len(contract.id) > MAX_ID:
        raise refuse(
            f"the id is {len(contract.id)} characters; ids are at most {MAX_ID}, "
            "namespace included (^[a-z0-9_]{1,64}$, the OpenAI and Anthropic limit)"
        )
    if not 1 <= len(contract.description.strip()) <= 200 or len(contract.description) > 200:
        raise refuse("description must be 1-200 characters")
    if contract.effect not in EFFECTS:
        raise refuse(f"effect must be one of {', '.join(EFFECTS)}")
    if contract.consequence_level not in CONSEQUENCE_LEVELS:
        raise refuse(f"consequence level must be one of {', '.join(CONSEQUENCE_LEVELS)}")
    for dependency in contract.depends_on:
        if not isinstance(dependency, str) or not ID_RE.fullmatch(dependency):
            raise refuse(f"dependsOn names {str(dependency)[:80]!r}, which is no tool id")
    if contract.id in contract.depends_on:
        raise refuse("dependsOn names the tool itself")
    if len(set(contract.depends_on)) != len(contract.depends_on):
        raise refuse("dependsOn names a tool twice")
    if not 0 < contract.timeout_s <= 600:
        raise refuse("timeout must be between 0 and 600 seconds")
    if not (isinstance(contract.params, type) and issubclass(contract.params, ToolParams)):
        raise refuse("params must subclass ToolParams (which forbids unknown keys)")
    if contract.redaction is None:
        raise refuse("a redaction allowlist is required (REDACTION_REQUIRED)")
    unknown = set(contract.capabilities) - KNOWN_CAPABILITIES
    if unknown:
        raise refuse(f"unknown capabilities {sorted(unknown)}")
    if contract.runs_inline:
        waiting = set(contract.capabilities) - NEVER_WAIT
        if waiting:
            raise refuse(
                f"runs inline, so it may not wait: capabilities {sorted(waiting)} can "
                f"(inline tools may declare only {sorted(NEVER_WAIT)})"
            )
        if contract.requires_connection:
            raise refuse("runs inline, so it may not wait: it may not require a connection")
    try:
        if contract.params.declared_schema is None:
            input_schema = compile_model(contract.params)
            check_input_schema(input_schema)
        else:  # declared in JSON Schema (an imported tool): listed and validated as declared
            input_schema = contract.params.declared_schema
            check_declared_input_schema(input_schema)
        output_schema = compile_model(contract.result)
        check_output_schema(output_schema)
        check_paths(contract.redaction.result, output_schema, "result")
        check_paths(contract.redaction.args, input_schema, "args")
        result_tree = build_tree(contract.redaction.result)
        args_tree = build_tree(contract.redaction.args)
    except (SchemaError, RedactionError) as exc:
        raise refuse(str(exc)) from None
    try:
        call_settings.check(
            contract.effect, input_schema, contract.call_idempotency, contract.call_retries
        )
    except call_settings.CallSettingsError as exc:
        raise refuse(str(exc)) from None
    return RegisteredTool(
        contract=contract,
        input_schema=input_schema,
        output_schema=output_schema,
        schema_hash=schema_hash(input_schema),
        result_tree=result_tree,
        args_tree=args_tree,
    )


class ToolRegistry:
    def __init__(self) -> None:
        self._tools: dict[str, RegisteredTool] = {}

    def register(self, contract: ToolContract) -> RegisteredTool:
        tool = check_contract(contract)
        if tool.id in self._tools:
            raise ToolRegistrationError(f"tool id collision: {tool.id} is already registered")
        self._tools[tool.id] = tool
        return tool

    def unregister(self, tool_id: str) -> None:
        self._tools.pop(tool_id, None)

    def load_modules(self, modules: list[str]) -> None:
        for module_name in modules:
            module = importlib.import_module(module_name)
            contracts = getattr(module, "CONTRACTS", None)
            if contracts is None:
                raise ToolRegistrationError(f"{module_name} has no CONTRACTS list")
            for contract in contracts:
                self.register(contract)
        self.check_dependencies()

    def check_dependencies(self) -> None:
        """Every `dependsOn` names a registered tool: checked once all modules are loaded,
        so a tool may name one registered after it."""
        for tool in self._tools.values():
            missing = [d for d in tool.contract.depends_on if d not in self._tools]
            if missing:
                raise ToolRegistrationError(
                    f"tool {tool.id}: dependsOn names {', '.join(missing)}, which is not registered"
                )

    def get(self, tool_id: str) -> RegisteredTool | None:
        return self._tools.get(tool_id)

    def all(self) -> list[RegisteredTool]:
        return sorted(self._tools.values(), key=lambda tool: tool.id)


registry = ToolRegistry()
