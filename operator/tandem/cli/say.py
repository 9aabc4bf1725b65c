"""The CLI's console output: whatever a user, a job file or an exception wrote is printed as text, never
read as rich markup (a `[/INST]` in a message raised rich's MarkupError, and bracketed words vanished),
and lines are never hard-wrapped (a pipe or a file is not a terminal: rich would cut them at 80 columns,
splitting field paths and file names).

Callers: `tandem.cli.main` (validate, crd, export, models), `tandem.cli.local` and
`tandem.cli.supervise` (`tandem run`'s notes and failures).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text


def console(stderr: bool = False, **options: Any) -> Console:
    """A console that wraps nothing and highlights nothing (tables still fit the terminal); `options` are
    rich's (a test's file, force_terminal, width)."""
    return Console(stderr=stderr, soft_wrap=True, highlight=False, **options)


def failed(text: str) -> Text:
    """A red cross, then `text` as it is."""
    return Text.assemble(("✗", "red"), " ", text)


def passed(text: str) -> Text:
    """A green check, then `text` as it is."""
    return Text.assemble(("✓", "green"), " ", text)


def styled(text: str, style: str) -> Text:
    """`text` as it is, in `style` (e.g. yellow for a note)."""
    return Text(text, style=style)
