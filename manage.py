#!/usr/bin/env python
"""Django's command-line entry point for toolhub."""

import os
import sys
from pathlib import Path

PROJECT_PYTHON = Path(__file__).resolve().parent / ".venv" / "bin" / "python"


def wrong_interpreter(problem: str) -> None:
    """Run by a Python that is not the project's (`python manage.py` in a fresh shell):
    say which one to use instead of a traceback."""
    sys.stderr.write(
        f"manage.py: {problem} ({sys.executable}, Python {sys.version.split()[0]}).\n"
        f"Use the project's interpreter: {os.path.relpath(PROJECT_PYTHON)} manage.py ... "
        "(`make venv` creates it with Python >= 3.12).\n"
    )
    sys.exit(2)


def main() -> None:
    if sys.version_info < (3, 12):  # noqa: UP036  (run by another interpreter)
        wrong_interpreter("toolhub needs Python 3.12 or newer, not this one")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolhub.settings")
    try:
        from django.core.management import execute_from_command_line
    except ModuleNotFoundError:
        wrong_interpreter("this Python has no Django installed")
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
