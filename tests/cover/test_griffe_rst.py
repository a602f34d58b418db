"""The docs build's docstring rewriting (``tools/griffe_rst.py``): roles and doctest sessions."""

import griffe

from tools.griffe_rst import RstToMarkdown, markdown_of


def test_a_role_becomes_inline_code_and_tilde_keeps_the_last_part() -> None:
    text = ":func:`ring_ref.ring_all_reduce` and :class:`~ring_ref.difftest.Report`, not ``:func:``"
    assert markdown_of(text) == "`ring_ref.ring_all_reduce` and `Report`, not ``:func:``"


def test_a_doctest_session_is_fenced_up_to_the_blank_line_after_it() -> None:
    text = "Run:\n\n    >>> 1 + 1\n    2\n    >>> for i in ():\n    ...     pass\n\nDone."
    assert markdown_of(text).split("\n") == [
        "Run:",
        "",
        "    ```pycon",
        "    >>> 1 + 1",
        "    2",
        "    >>> for i in ():",
        "    ...     pass",
        "    ```",
        "",
        "Done.",
    ]


def test_a_session_at_the_end_is_closed() -> None:
    assert markdown_of(">>> 1\n1") == "```pycon\n>>> 1\n1\n```"


def test_the_extension_rewrites_every_docstring_griffe_loads() -> None:
    module = griffe.load("ring_ref.testing", extensions=griffe.load_extensions(RstToMarkdown))
    docstring = module.docstring
    assert docstring is not None
    assert ":mod:" not in docstring.value and "`ring_ref._tracecheck`" in docstring.value
    assert "```pycon\n>>> import torch" in docstring.value
