"""core__get_current_time: the current time, optionally in an IANA time zone."""

from __future__ import annotations

from functools import cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from pydantic import Field

from apps.tools.capabilities import Capabilities
from apps.tools.contracts import (
    Redaction,
    ToolContext,
    ToolContract,
    ToolError,
    ToolOutput,
    ToolParams,
)


class GetCurrentTimeParams(ToolParams):
    timezone: str | None = Field(
        default=None,
        max_length=64,
        description="IANA time zone such as 'Europe/Paris'; UTC when omitted.",
    )


class CurrentTime(ToolOutput):
    iso: str = Field(description="ISO 8601 time with offset")
    timezone: str
    unix: float = Field(description="Seconds since the Unix epoch")


@cache
def _zone_names() -> frozenset[str]:
    return frozenset(available_timezones())


def get_current_time(
    params: GetCurrentTimeParams, ctx: ToolContext, caps: Capabilities
) -> CurrentTime:
    name = params.timezone or "UTC"
    # ZoneInfo would also accept file-system paths; only real zone names are valid here.
    if name not in _zone_names() and name != "UTC":
        raise ToolError(f"Unknown time zone {name!r}: use an IANA name such as 'Europe/Paris'.")
    try:
        zone = ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ToolError(f"Unknown time zone {name!r}.") from None
    now = caps.require("clock").now().astimezone(zone)
    return CurrentTime(iso=now.isoformat(), timezone=name, unix=now.timestamp())


CONTRACTS = [
    ToolContract(
        name="get_current_time",
        description="Get the current date and time, in UTC or in a given IANA time zone.",
        params=GetCurrentTimeParams,
        result=CurrentTime,
        execute=get_current_time,
        effect="read_only",
        redaction=Redaction(result=("iso", "timezone", "unix"), args=("timezone",)),
        capabilities=("clock",),
        tags=("time",),
        runs_inline=True,  # reads the clock and a time zone: nothing to wait on
    )
]
