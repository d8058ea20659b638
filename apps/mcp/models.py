"""MCP servers registered by staff and the tools imported from them (see docs/mcp.md).

A server is global, like the catalog: only superusers add or change one, never the
public API. What it runs is data a staff member chose; a stdio command must name an
executable on the TOOLHUB_MCP_STDIO_COMMANDS allowlist, checked when saved and again
before every start, so a row written before the allowlist shrank cannot run.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import shlex
from pathlib import PurePath
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models

from apps.connections.netguard import PRIVATE, address_problem
from apps.tools.models import ConsequenceLevel, Effect, Tool

SERVER_NAME_RE = r"^[a-z0-9]{1,16}$"  # no "_": `mcp__<name>__<tool>` must split unambiguously


class Transport(models.TextChoices):
    HTTP = "http", "streamable HTTP"
    STDIO = "stdio", "stdio (local process)"


class CommandNotAllowed(ValueError):
    """A stdio command whose executable is not on TOOLHUB_MCP_STDIO_COMMANDS."""


def allowed_argv(command: str) -> list[str]:
    """The argv for a stdio command, or CommandNotAllowed.

    Only the bare executable name is compared (no paths: "/tmp/x/mcp-server-time" is
    not "mcp-server-time"), so the allowlist names programs found on PATH.
    """
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise CommandNotAllowed(f"the command cannot be parsed: {exc}") from None
    if not argv:
        raise CommandNotAllowed("the command is empty")
    allowed = settings.TOOLHUB_MCP_STDIO_COMMANDS
    if argv[0] not in allowed or PurePath(argv[0]).name != argv[0]:
        listed = ", ".join(allowed) or "none"
        raise CommandNotAllowed(
            f"{argv[0]!r} is not on TOOLHUB_MCP_STDIO_COMMANDS (allowed: {listed})"
        )
    return argv


def literal_address_problem(url: str, allow_private: bool) -> str:
    """Why a URL whose host is an IP address may not be registered ("" if it may).

    Host names are judged on every connection instead, by what they resolve to then
    (apps/mcp/egress.py); an address is refused here already, where the fix is known.
    """
    host = (urlsplit(url).hostname or "").strip("[]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return ""
    problem = address_problem(address, allow_private)
    if not problem:
        return ""
    if problem == PRIVATE:
        return (
            f"{host} is {problem}: only a superuser can let toolhub reach it "
            "(allow private network, or mcp_add --allow-private-network)."
        )
    return f"{host} is {problem}, which toolhub never reaches."


class McpServer(models.Model):
    name = models.CharField(
        max_length=16,
        unique=True,
        validators=[RegexValidator(SERVER_NAME_RE, "1-16 characters: a-z and 0-9.")],
        help_text="Tools are imported as mcp__<name>__<tool>.",
    )
    transport = models.CharField(max_length=8, choices=Transport.choices)
    url = models.URLField(blank=True, help_text="Streamable HTTP endpoint (transport http).")
    command = models.CharField(
        max_length=500,
        blank=True,
        help_text="Command line (transport stdio); the program must be on "
        "TOOLHUB_MCP_STDIO_COMMANDS.",
    )
    allow_private_network = models.BooleanField(
        default=False,
        help_text="Let toolhub reach this HTTP server on a private or loopback address "
        "(never link-local or cloud metadata). Checked on every connection, after DNS.",
    )
    enabled = models.BooleanField(default=True, help_text="Disabled: no session, no calls.")
    timeout_ms = models.PositiveIntegerField(
        default=15000, help_text="Timeout of each imported tool's calls (and of discovery)."
    )
    last_synced_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_error = models.TextField(blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "MCP server"

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        """The runner times a call by its catalog row (Tool.timeout_ms), which discovery
        copies from the server: a changed timeout is copied to its tools' rows here, so
        the next call has it without waiting for a re-sync."""
        super().save(*args, **kwargs)
        update_fields = kwargs.get("update_fields")
        if update_fields is None or "timeout_ms" in update_fields:
            Tool.objects.filter(mcp__server=self).exclude(timeout_ms=self.timeout_ms).update(
                timeout_ms=self.timeout_ms
            )

    def clean(self) -> None:
        if self.transport == Transport.HTTP:
            if not self.url or self.command:
                raise ValidationError("An HTTP server has a URL and no command.")
            problem = literal_address_problem(self.url, self.allow_private_network)
            if problem:
                raise ValidationError({"url": problem})
        elif self.transport == Transport.STDIO:
            if not self.command or self.url:
                raise ValidationError("A stdio server has a command and no URL.")
            try:
                allowed_argv(self.command)
            except CommandNotAllowed as exc:
                raise ValidationError({"command": str(exc)}) from None

    @property
    def tool_prefix(self) -> str:
        return f"mcp__{self.name}__"


def tool_hash(description: str, input_schema: dict[str, Any]) -> str:
    """What an admin accepted: a change of either disables the tool (tool poisoning)."""
    canonical = json.dumps([description, input_schema], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class McpTool(models.Model):
    """One imported tool: what the server declared and what an admin accepted.

    `description` and `input_schema` are the accepted version, the one that runs;
    a re-sync that sees something else stores it in `pending_*` and disables the
    tool until an admin accepts the change. Annotations are hints, never trusted:
    `effect` starts as external_side_effect whatever the server says.
    """

    # db_index=False: mcp_tool_once leads with it (tests/test_indexes.py).
    server = models.ForeignKey(
        McpServer, on_delete=models.CASCADE, related_name="tools", db_index=False
    )
    remote_name = models.CharField(max_length=200)
    tool = models.OneToOneField(Tool, on_delete=models.CASCADE, related_name="mcp")
    description = models.TextField(blank=True)
    input_schema = models.JSONField(default=dict)
    accepted_hash = models.CharField(max_length=64)
    annotations = models.JSONField(default=dict, blank=True, help_text="Server's hints only.")
    effect = models.CharField(
        max_length=24, choices=Effect.choices, default=Effect.EXTERNAL_SIDE_EFFECT
    )
    consequence_level = models.CharField(
        max_length=8, choices=ConsequenceLevel.choices, default=ConsequenceLevel.MEDIUM
    )
    requires_confirmation = models.BooleanField(default=False)
    redaction_args = models.JSONField(
        default=list, blank=True, help_text="Argument names kept in records (default: all)."
    )
    unusable_reason = models.TextField(blank=True, help_text="Why the tool cannot be called.")
    pending_description = models.TextField(blank=True)
    pending_input_schema = models.JSONField(null=True, blank=True)
    pending_since = models.DateTimeField(null=True, blank=True)
    enabled_before_change = models.BooleanField(default=False, editable=False)
    seen_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tool_id"]
        verbose_name = "imported MCP tool"
        constraints = [
            models.UniqueConstraint(fields=["server", "remote_name"], name="mcp_tool_once")
        ]

    def __str__(self) -> str:
        return self.tool_id

    @property
    def has_pending_change(self) -> bool:
        return self.pending_since is not None

    def pending_diff(self) -> str:
        """A unified diff of the accepted and the newly declared description and schema."""
        import difflib

        def text(description: str, schema: Any) -> list[str]:
            dumped = json.dumps(schema, indent=2, sort_keys=True)
            return [f"description: {description}", *dumped.splitlines()]

        if not self.has_pending_change:
            return ""
        return "\n".join(
            difflib.unified_diff(
                text(self.description, self.input_schema),
                text(self.pending_description, self.pending_input_schema),
                "accepted",
                "declared now",
                lineterm="",
            )
        )


class McpServerCredential(models.Model):
    """A tenant's credentials for an HTTP server: a connection whose secret the broker
    turns into request headers for that tenant's calls (never from arguments)."""

    # db_index=False: mcp_credential_once leads with it (tests/test_indexes.py).
    server = models.ForeignKey(
        McpServer, on_delete=models.CASCADE, related_name="credentials", db_index=False
    )
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE)
    connection = models.ForeignKey("connections.Connection", on_delete=models.CASCADE)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["server", "tenant"], name="mcp_credential_once")
        ]

    def __str__(self) -> str:
        return f"{self.server} for {self.tenant}"

    def clean(self) -> None:
        if self.connection_id and self.connection.tenant_id != self.tenant_id:
            raise ValidationError("The connection must belong to the same tenant.")
