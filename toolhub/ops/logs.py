"""Log lines that a caller cannot forge: control characters are escaped in every field.

A value such as a `toolId` containing a newline used to start a new, forged log line. The
formatter, not each call site, escapes: every logger and every field goes through it.

- The record's own line (message with its arguments, logger name, everything the format
  string places) has C0 and C1 controls, DEL and the Unicode line and paragraph separators
  written as escapes (`\\n`, `\\x1b`, `\\u2028`), so it stays one line.
- A traceback or stack (`exc_info`, `stack_info`) keeps its lines, since that is how it is
  read, but each of its lines is escaped the same way and indented by two spaces. So a line
  that starts in the first column always starts a real record, even when an exception's
  message carries attacker text.
"""

from __future__ import annotations

import logging
import re

# C0 controls, DEL, C1 controls (NEL included), LINE SEPARATOR, PARAGRAPH SEPARATOR.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_one(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """`text` on one line: every control or line-breaking character as a visible escape."""
    return _CONTROL.sub(_escape_one, text)


class SafeFormatter(logging.Formatter):
    """A `logging.Formatter` whose output a logged value cannot split into extra records."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_controls(super().formatMessage(record))

    def format(self, record: logging.LogRecord) -> str:
        # formatMessage made the record's line one line; what follows its first newline is
        # the traceback or stack that logging appends.
        line, _, trailer = super().format(record).partition("\n")
        if not trailer:
            return line
        return line + "\n" + "\n".join("  " + escape_controls(part) for part in trailer.split("\n"))
