"""A Griffe extension for ``make docs``: the package's reST-flavoured docstrings rendered as Markdown.

The docstrings are written for ``help()`` and doctest: Sphinx roles
(``:func:`ring_all_reduce```) and bare ``>>>`` sessions.  Rendered as Markdown
by mkdocstrings, a role would show its ``:func:`` prefix and a session would
become nested block quotes.  This extension rewrites each docstring's text
before rendering: a role becomes its target as inline code (``~`` keeps the
last dotted part, as in Sphinx), and each run of ``>>>`` / ``...`` lines with
the output below it becomes a fenced ``pycon`` block.  mkdocs.yml loads it
from this file; ``tests/cover/test_griffe_rst.py`` checks it.
"""

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|data|attr|exc|obj|const):`(~?)([^`]+)`")
PROMPT = re.compile(r"^(\s*)>>> ")


def _role(match: re.Match[str]) -> str:
    short, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


def markdown_of(text: str) -> str:
    """``text`` with its Sphinx roles as inline code and its doctest sessions fenced."""
    out: list[str] = []
    fence: str | None = None  # the open session's closing fence, indented as its prompt
    for line in ROLE.sub(_role, text).split("\n"):
        prompt = PROMPT.match(line)
        if fence is None and prompt:
            out.append(prompt.group(1) + "```pycon")
            fence = prompt.group(1) + "```"
        elif fence is not None and not line.strip():
            out.append(fence)
            fence = None
        out.append(line)
    if fence is not None:
        out.append(fence)
    return "\n".join(out)


class RstToMarkdown(griffe.Extension):
    """Rewrites every docstring of the loaded package with :func:`markdown_of`."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Called by Griffe for every object it loads."""
        if obj.docstring is not None:
            obj.docstring.value = markdown_of(obj.docstring.value)
