"""What every command shares: the console, the user-error type, the repository root."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

__all__ = ["CliError", "REPO_ROOT", "console"]

REPO_ROOT = Path(__file__).resolve().parents[1]
# Wide enough for the program table when the output is a file or CI log.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)


class CliError(Exception):
    """A user-facing failure: printed without a traceback, exit status 2."""
