"""Tool ids become `^[a-z0-9_]{1,64}$` (API.md), so every id is an OpenAI/Anthropic name.

Earlier, the registry accepted a namespace and a name with `-` (ids up to 98 characters).
A row whose id breaks the rule gets a new one: the namespace without what the rule
refuses, the name lower case with `-` and other characters as `_`; when that is too long
or already taken, it is cut and ends with `_` and 8 hex characters of the old id's SHA-256.
What names the tool follows it: records (their `tool` link; `tool_ref` keeps the id as it
was requested), approvals, policies' allowlists, rules and patterns naming exactly the old
id, imported MCP tools, and object permissions. A tool defined in code must then be
renamed in its module to the new id, which the registry's refusal at start-up names.
"""

from __future__ import annotations

import hashlib
import re

from django.db import migrations

ID_RE = re.compile(r"^[a-z0-9_]{1,64}$")


def new_id(old: str, taken: set[str]) -> str:
    namespace, separator, name = old.partition("__")
    if separator:
        candidate = (
            re.sub(r"[^a-z0-9]", "", namespace.lower())
            + "__"
            + re.sub(r"[^a-z0-9_]", "_", name.lower())
        )
    else:
        candidate = re.sub(r"[^a-z0-9_]", "_", old.lower())
    if ID_RE.fullmatch(candidate) and candidate.strip("_") and candidate not in taken:
        return candidate
    stem = candidate[: 64 - 9].rstrip("_") or "tool"
    return f"{stem}_{hashlib.sha256(old.encode()).hexdigest()[:8]}"


def valid_ids(apps, schema_editor):
    Tool = apps.get_model("tools", "Tool")
    wrong = [tool for tool in Tool.objects.order_by("pk") if not ID_RE.fullmatch(tool.pk)]
    if not wrong:
        return
    taken = set(Tool.objects.values_list("pk", flat=True))
    for tool in wrong:
        old = tool.pk
        new = new_id(old, taken)
        taken.add(new)
        rename(apps, old, new)


def rename(apps, old: str, new: str) -> None:
    Tool = apps.get_model("tools", "Tool")
    tool = Tool.objects.get(pk=old)
    tool.pk = new
    tool.save(force_insert=True)
    for label in ("invocations.InvocationRecord", "approvals.ApprovalRequest", "mcp.McpTool"):
        apps.get_model(label).objects.filter(tool_id=old).update(tool_id=new)
    Policy = apps.get_model("policies", "Policy")
    Policy.tools.through.objects.filter(tool_id=old).update(tool_id=new)
    for policy in Policy.objects.filter(tool_patterns__contains=old):
        lines = [new if line.strip() == old else line for line in policy.tool_patterns.split("\n")]
        policy.tool_patterns = "\n".join(lines)
        policy.save(update_fields=["tool_patterns"])
    apps.get_model("policies", "PolicyRule").objects.filter(tool_pattern=old).update(
        tool_pattern=new
    )
    ContentType = apps.get_model("contenttypes", "ContentType")
    kind = ContentType.objects.filter(app_label="tools", model="tool").first()
    if kind is not None:
        for label in ("guardian.UserObjectPermission", "guardian.GroupObjectPermission"):
            permissions = apps.get_model(label).objects
            permissions.filter(content_type=kind, object_pk=old).update(object_pk=new)
    Tool.objects.filter(pk=old).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("tools", "0002_result_cache"),
        ("approvals", "0001_initial"),
        ("invocations", "0001_initial"),
        ("mcp", "0001_servers_and_imported_tools"),
        ("policies", "0001_initial"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("guardian", "0001_initial"),
    ]

    operations = [migrations.RunPython(valid_ids, migrations.RunPython.noop)]
