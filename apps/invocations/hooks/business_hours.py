"""BusinessHours: calls of the matching tools only in office hours.

A before_authorization hook: outside the configured days and hours (in the configured
time zone) the call is refused before anything else is asked, with `policy_denied` and
a message that says when calls are accepted. A window that ends before it starts spans
midnight (22:00-06:00). Approved calls are checked again when they run, so an approval
given late does not let a call run at night.

    {"hook": "apps.invocations.hooks.business_hours.BusinessHours",
     "effects": ["external_side_effect"],
     "options": {"timezone": "Europe/Berlin", "days": ["mon", "tue", "wed", "thu", "fri"],
                 "start": "08:00", "end": "18:00"}}
"""

from __future__ import annotations

from datetime import datetime, time
from zoneinfo import ZoneInfo

from apps.invocations.hooks import Hook, HookCall

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def _clock(value: str) -> time:
    try:
        return time.fromisoformat(value)
    except (TypeError, ValueError):
        raise ValueError(f"{value!r} is not a time of day (HH:MM)") from None


class BusinessHours(Hook):
    def __init__(
        self,
        timezone: str = "UTC",
        days: list[str] | None = None,
        start: str = "09:00",
        end: str = "17:00",
    ) -> None:
        self.zone = ZoneInfo(timezone)  # an unknown zone raises: the check reports it
        self.days = list(days) if days is not None else list(DAYS[:5])
        unknown = sorted(set(self.days) - set(DAYS))
        if unknown or not self.days:
            raise ValueError(f"days must be some of {', '.join(DAYS)}; got {self.days}")
        self.start, self.end = _clock(start), _clock(end)
        if self.start == self.end:
            raise ValueError("start and end must differ")
        self.timezone = timezone

    def open_at(self, moment: datetime) -> bool:
        local = moment.astimezone(self.zone)
        now = local.time().replace(tzinfo=None)
        if self.start < self.end:
            return DAYS[local.weekday()] in self.days and self.start <= now < self.end
        # Spans midnight: the early hours belong to the day the window opened.
        opened = local.weekday() if now >= self.start else (local.weekday() - 1) % 7
        return DAYS[opened] in self.days and (now >= self.start or now < self.end)

    def before_authorization(self, call: HookCall) -> None:
        if not self.open_at(datetime.now(self.zone)):
            call.abort(
                "policy_denied",
                f"{call.tool_id} takes calls {', '.join(self.days)} "
                f"{self.start:%H:%M}-{self.end:%H:%M} ({self.timezone}) only.",
            )
