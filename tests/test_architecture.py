"""Architecture rules checked on the source: one execution path, pure tool modules, no secrets.

TOOLS_VIA_TOOLRUNNER: only apps/invocations/runner.py reaches a tool's execute
function. TOOL_FILE_PURITY: tool modules import no settings, environment, ORM or
network clients. NO_SECRETS_IN_CONTEXT: the tool context carries references only.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from apps.tools.contracts import ToolContext
from apps.tools.registry import registry
from tests.support import tools as support_tools

ROOT = Path(__file__).resolve().parent.parent
SCANNED_PACKAGES = ("apps", "toolhub", "tests")
RUNNER = "apps/invocations/runner.py"
EXECUTE = "execute"  # spelled once, so this file does not access `.execute` itself
# Other `.execute` methods that are not tools, per module, by receiver name. Keep it short:
# each entry is a place a reviewer agreed cannot hold a tool contract.
OTHER_EXECUTE_RECEIVERS = {
    "apps.policies.conditions": {"program"},  # a compiled CEL program
    "apps.approvals.wake": {"raw"},  # a psycopg connection (LISTEN)
    "tests.faults.test_outages": {"db"},  # a sqlite3/psycopg connection reading the records
    "toolhub.db.postgresql.base": {"super"},  # the prepared cursor's psycopg Cursor.execute
    "tests.tenants.test_epoch_at_checkout": {"other", "conn"},  # psycopg connections
    "toolhub.db.index_ops": {"schema_editor"},  # a migration's schema editor (DROP INDEX)
    "toolhub.layers.redis_layer": {"pipe"},  # a Redis pipeline (RedisLayer._pipelined)
    "tests.streams.test_redis_layer": {"Pipeline"},  # redis-py's, counted by a test
}


def source_files() -> list[Path]:
    files = []
    for package in SCANNED_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.relative_to(ROOT).parts:
                files.append(path)
    return files


def module_name(path: Path) -> str:
    """Dotted module name; a package's __init__ keeps the suffix so relative imports resolve."""
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def resolve_relative(module: str, level: int, target: str | None) -> str:
    """The absolute module a `from <dots><target> import` in `module` names."""
    parts = module.split(".")[:-level] if level else []
    return ".".join([*parts, target] if target else parts) if level else (target or "")


# ---------------------------------------------------------------- TOOLS_VIA_TOOLRUNNER


def _receiver_name(node: ast.expr) -> str:
    """The name an attribute is read from: `cursor` in cursor.x, connection.cursor().x."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call):
        return _receiver_name(node.func)
    return ""


def _is_db_cursor(node: ast.expr) -> bool:
    return re.fullmatch(r"_?(cursor|cur)", _receiver_name(node)) is not None


def execute_functions() -> set[tuple[str, str]]:
    """(module, function name) of every registered tool's execute function."""
    contracts = [tool.contract for tool in registry.all()] + list(support_tools.CONTRACTS)
    found = set()
    for contract in contracts:
        function = getattr(contract, EXECUTE)
        found.add((function.__module__, function.__name__))
    return found


def _imported_names(
    tree: ast.Module, module: str
) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """Local names bound to (module, attribute) by `from m import a`, and to modules."""
    functions: dict[str, tuple[str, str]] = {}
    modules: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = resolve_relative(module, node.level, node.module)
            for alias in node.names:
                local = alias.asname or alias.name
                functions[local] = (source, alias.name)
                modules[local] = f"{source}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    modules[alias.asname] = alias.name
                else:
                    modules[alias.name.split(".")[0]] = alias.name.split(".")[0]
    return functions, modules


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def runner_bypasses(source: str, module: str, targets: set[tuple[str, str]]) -> list[str]:
    """Lines of `source` that reach a tool's execute function other than through the runner."""
    tree = ast.parse(source)
    problems = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == EXECUTE
            and not _is_db_cursor(node.value)
            and _receiver_name(node.value) not in OTHER_EXECUTE_RECEIVERS.get(module, ())
        ):
            problems.append(f"{module}:{node.lineno} reads .{EXECUTE}")

    functions, modules = _imported_names(tree, module)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        called: tuple[str, str] | None = None
        if isinstance(node.func, ast.Name) and node.func.id in functions:
            called = functions[node.func.id]
        elif isinstance(node.func, ast.Attribute):
            owner = _dotted(node.func.value)
            if owner is not None:
                head, _, rest = owner.partition(".")
                resolved = modules.get(head, head)
                full = f"{resolved}.{rest}" if rest else resolved
                called = (full, node.func.attr)
        if called in targets and called[0] != module.removesuffix(".__init__"):
            problems.append(f"{module}:{node.lineno} calls {called[0]}.{called[1]} directly")
    return problems


def test_the_checker_flags_reading_a_contracts_execute():
    assert runner_bypasses("contract.execute(p, c, k)", "apps.elsewhere", set())


def test_the_checker_allows_other_execute_methods_only_where_listed():
    assert not runner_bypasses("program.execute(v)", "apps.policies.conditions", set())
    assert runner_bypasses("program.execute(v)", "apps.elsewhere", set())
    assert runner_bypasses("contract.execute(v)", "apps.policies.conditions", set())


def test_the_checker_flags_calling_an_imported_tool_function():
    source = "from apps.tools.builtin.clock import get_current_time\nget_current_time(1, 2, 3)\n"
    targets = {("apps.tools.builtin.clock", "get_current_time")}
    assert runner_bypasses(source, "apps.elsewhere", targets)


def test_the_checker_flags_calling_a_tool_function_through_its_module():
    targets = {("apps.tools.builtin.clock", "get_current_time")}
    for source in (
        "from apps.tools.builtin import clock\nclock.get_current_time(1, 2, 3)\n",
        "import apps.tools.builtin.clock as c\nc.get_current_time(1, 2, 3)\n",
        "import apps.tools.builtin.clock\napps.tools.builtin.clock.get_current_time(1, 2, 3)\n",
        "from apps.tools.builtin.clock import get_current_time as now\nnow(1, 2, 3)\n",
    ):
        assert runner_bypasses(source, "apps.elsewhere", targets), source


def test_the_checker_allows_db_cursors_and_the_defining_module():
    targets = {("apps.tools.builtin.clock", "get_current_time")}
    assert not runner_bypasses(
        "with connection.cursor() as cursor:\n    cursor.execute('SELECT 1')\n"
        "connection.cursor().execute('SELECT 1')\n",
        "toolhub.ops.health",
        targets,
    )
    assert not runner_bypasses(
        "def get_current_time(p, c, k):\n    pass\nget_current_time(1, 2, 3)\n",
        "apps.tools.builtin.clock",
        targets,
    )


def test_the_tool_functions_to_protect_are_found():
    targets = execute_functions()
    assert ("apps.tools.builtin.clock", "get_current_time") in targets
    assert ("apps.tools.builtin.planning", "setup_plan") in targets
    assert ("tests.support.tools", "echo") in targets


def test_only_the_runner_reaches_a_tools_execute_function():
    targets = execute_functions()
    files = source_files()
    assert ROOT / RUNNER in files
    problems = []
    for path in files:
        if path == ROOT / RUNNER:
            continue
        problems += runner_bypasses(path.read_text(), module_name(path), targets)
    assert problems == []


def test_the_runner_does_reach_the_execute_function():
    """Guards the rule above from passing because nothing executes tools at all."""
    source = (ROOT / RUNNER).read_text()
    assert runner_bypasses(source, "apps.invocations.runner", execute_functions())


# ---------------------------------------------------------------- TOOL_FILE_PURITY

FORBIDDEN_IMPORT_ROOTS = frozenset(
    {
        "django",
        "os",
        "sys",
        "environ",
        "dotenv",
        "decouple",
        "requests",
        "httpx",
        "urllib",
        "urllib3",
        "socket",
        "http",
        "aiohttp",
        "subprocess",
        "importlib",
        "rest_framework",
        "channels",
        "toolhub",
    }
)
ALLOWED_APPS_MODULES = frozenset({"apps.tools.contracts", "apps.tools.capabilities"})
FORBIDDEN_NAMES = frozenset({"getenv", "environ", "__import__", "open"})


def purity_problems(source: str, module: str) -> list[str]:
    tree = ast.parse(source)
    imported: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = resolve_relative(module, node.level, node.module)
            for alias in node.names:
                # `from apps.tools import contracts` names the allowed module itself.
                full = f"{base}.{alias.name}"
                imported.append((node.lineno, full if full in ALLOWED_APPS_MODULES else base))
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            imported.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_NAMES:
            imported.append((node.lineno, node.attr))

    problems = []
    for line, name in imported:
        root = name.split(".")[0]
        if name in FORBIDDEN_NAMES:
            problems.append(f"{module}:{line} uses {name}")
        elif root in FORBIDDEN_IMPORT_ROOTS or (
            root == "apps" and name not in ALLOWED_APPS_MODULES
        ):
            problems.append(f"{module}:{line} imports {name}")
    return problems


def tool_module_files() -> list[Path]:
    return sorted((ROOT / "apps/tools/builtin").glob("*.py"))


def test_the_tool_modules_are_found():
    names = {path.name for path in tool_module_files()}
    assert {"clock.py", "planning.py"} <= names


@pytest.mark.parametrize("path", tool_module_files(), ids=lambda path: path.name)
def test_tool_modules_import_no_settings_environment_orm_or_network(path):
    assert purity_problems(path.read_text(), module_name(path)) == []


@pytest.mark.parametrize(
    "source",
    [
        "import os",
        "from os import environ",
        "from django.conf import settings",
        "from django.db import models",
        "import requests",
        "import httpx",
        "from urllib.request import urlopen",
        "import socket",
        "from apps.tools.models import Tool",
        "from apps.planning.models import Plan",
        "import apps.invocations.runner",
        "from ..models import Tool",
        "from .. import registry",
        "from apps.tools import models",
        "import dotenv",
        "x = __import__('os')",
        "token = getenv('TOKEN')",
        "data = open('/etc/passwd').read()",
    ],
)
def test_the_purity_checker_flags_impure_imports(source):
    assert purity_problems(source, "apps.tools.builtin.example")


def test_the_purity_checker_allows_what_tools_may_use():
    source = (
        "from __future__ import annotations\n"
        "from zoneinfo import ZoneInfo\n"
        "from typing import Any\n"
        "from pydantic import BaseModel, Field\n"
        "from apps.tools.contracts import ToolParams, ToolContract\n"
        "from apps.tools.capabilities import Capabilities\n"
        "from apps.tools import contracts\n"
        "from .. import contracts as c\n"
    )
    assert purity_problems(source, "apps.tools.builtin.example") == []


# ---------------------------------------------------------------- NO_SECRETS_IN_CONTEXT

SECRET_SHAPED = re.compile(r"token|secret|passw|key|authoriz|credential|header|cookie", re.I)


def test_the_secret_shape_matcher_catches_likely_names():
    for name in (
        "api_key",
        "access_token",
        "password",
        "auth_header",
        "credentials",
        "Authorization",
    ):
        assert SECRET_SHAPED.search(name), name
    for name in ("tenant", "principal", "run_id", "connection_id", "deadline"):
        assert not SECRET_SHAPED.search(name), name


def test_the_tool_context_carries_no_secret_shaped_field():
    names = [field.name for field in dataclasses.fields(ToolContext)]
    assert "connection_id" in names
    assert [name for name in names if SECRET_SHAPED.search(name)] == []


def test_the_tool_context_has_no_properties_or_methods_with_secret_shaped_names():
    names = [name for name in vars(ToolContext) if not name.startswith("__")]
    assert [name for name in names if SECRET_SHAPED.search(name)] == []


def test_relative_imports_resolve_against_the_importing_module():
    assert (
        resolve_relative("apps.tools.builtin.clock", 1, "contracts")
        == "apps.tools.builtin.contracts"
    )
    assert resolve_relative("apps.tools.builtin.clock", 2, "contracts") == "apps.tools.contracts"
    assert resolve_relative("apps.tools.builtin.__init__", 1, "clock") == "apps.tools.builtin.clock"
    assert resolve_relative("apps.tools.builtin.clock", 0, "os") == "os"


# ---------------------------------------------------------------- dependencies point one way


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (function-level imports included)."""
    module = module_name(path)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            source = resolve_relative(module, node.level, node.module)
            found.add(source)
            found.update(f"{source}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def modules_reaching(start: str, graph: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def app_import_graph() -> dict[str, set[str]]:
    files = [path for path in source_files() if path.parts[len(ROOT.parts)] == "apps"]
    names = {module_name(path).removesuffix(".__init__") for path in files}
    return {
        module_name(path).removesuffix(".__init__"): {m for m in imports_of(path) if m in names}
        for path in files
    }


def test_the_runner_reaches_no_module_that_imports_it_back():
    """STYLE: the runner knows neither the approvals' internals nor any tool source's:
    approvals -> runner and sources -> tools, never back (a cycle here is a failure)."""
    graph = app_import_graph()
    reached = modules_reaching("apps.invocations.runner", graph)
    assert "apps.invocations.runner" not in reached
    assert not {m for m in reached if m.startswith(("apps.approvals.", "apps.mcp"))} - {
        "apps.approvals.models"
    }


def test_the_cycle_checker_sees_function_level_imports():
    graph = {"a": {"b"}, "b": {"a"}}
    assert "a" in modules_reaching("a", graph)
    source = "def f():\n    from apps.invocations import runner\n"
    assert "apps.invocations.runner" in {
        f"{node.module}.{alias.name}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def test_the_mcp_execute_function_is_reached_only_through_the_runner():
    """The imported tools' execute function is protected like a built-in's."""
    from apps.mcp import source

    targets = {("apps.mcp.source", "execute_remote")}
    assert source._executor(1, "x").__name__ == "execute_remote"
    problems = []
    for path in source_files():
        if path == ROOT / RUNNER:
            continue
        problems += runner_bypasses(path.read_text(), module_name(path), targets)
    assert [problem for problem in problems if "execute_remote" in problem] == []
