"""A ``reveal --json`` document read from its bytes without recursion, however deep its trees nest.

Python's ``json`` recurses on nesting, and a version 1 or 2 file spells a fold
of ``N`` workers as ``N - 1`` nested pairs (a ``RecursionError`` from ``N``
near 1000); holding ``M`` folds of ``N`` workers as lists of Python ints would
also take several times the file's size.  :func:`reveal_document` reads
``trees`` with a tokenizer of its own: a fold of workers, flat (version 3) or
as nested pairs, goes straight into one array of ``int32`` (``{"fold":
array}``), any other node into lists as ``json`` makes them; every other member
(small and shallow) is cut out and read by ``json``.  The patterns repeat
possessively (``*+``): a backtracking repeat would keep state for each of a
fold's ``N`` items.  The trees are then
checked by :func:`~ring_ref._order._json.tree_from_json`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, BinaryIO, Final

import numpy as np

__all__ = ["reveal_document"]

_WS: Final = re.compile(rb"[ \t\n\r]*")
_INT: Final = rb"(?:0|[1-9][0-9]{0,8})(?![0-9.eE])"
_INT_RE: Final = re.compile(_INT)
_S: Final = rb"[ \t\n\r]*"
_FOLD_OPEN: Final = re.compile(rb"\{" + _S + rb'"fold"' + _S + rb":" + _S + rb"\[")
_FOLD_CLOSE: Final = re.compile(_S + rb"\}")
_FOLD_OF_INTS: Final = re.compile(
    rb"\{"
    + _S
    + rb'"fold"'
    + _S
    + rb":"
    + _S
    + rb"\["
    + _S
    + rb"("
    + _INT
    + rb"(?:"
    + _S
    + rb","
    + _S
    + _INT
    + rb")*+)"
    + _S
    + rb"\]"
    + _S
    + rb"\}"
)
_PAIRS: Final = re.compile(
    rb"(\[++)"
    + _S
    + rb"("
    + _INT
    + rb")"
    + _S
    + rb","
    + _S
    + rb"("
    + _INT
    + rb")"
    + _S
    + rb"\]"
    + rb"((?:"
    + _S
    + rb","
    + _S
    + _INT
    + _S
    + rb"\])*+)"
)
_OPENS: Final = re.compile(rb"\[+")
_PAIR_TAIL: Final = re.compile(_S + rb"," + _S + rb"(" + _INT + rb")" + _S + rb"\]")
_TOKEN: Final = re.compile(
    _S + rb'(?:"(?:[^"\\]|\\.)*"|-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|true|false|null|[\[\]{},:])'
)
_NODE: Final = 'a tree node (a worker id, a list of two or more nodes or {"fold": [two or more nodes]})'


def _error(message: str, data: bytes, pos: int) -> json.JSONDecodeError:
    """``message`` at byte ``pos``, with its line and column (as ``json`` reports them)."""
    before = data[:pos].decode("utf-8", "replace")
    return json.JSONDecodeError(message, before, len(before))


def _ints(run: bytes) -> np.ndarray[Any, np.dtype[np.int32]]:
    """The integers of a run ``0, 1, 2`` or ``, 2], 3]`` (checked by the caller's pattern) as one
    array, parsed by numpy without a Python object per integer."""
    return np.fromstring(run.replace(b"]", b" ").strip(b" \t\n\r,"), dtype=np.int32, sep=",")


def _quick(data: bytes, pos: int) -> tuple[Any, int] | None:
    """A leaf, or a fold of workers only (flat or nested pairs) as ``{"fold": array}``, at ``pos``."""
    if match := _FOLD_OF_INTS.match(data, pos):
        return {"fold": _ints(match[1])}, match.end()
    if (match := _PAIRS.match(data, pos)) and (opens := len(match[1])) >= 2:
        tail = _ints(match[4])
        if len(tail) == opens - 1:
            return {"fold": np.concatenate([_ints(match[2] + b"," + match[3]), tail])}, match.end()
        if len(tail) > opens - 1:  # the fold is an item of a longer chain: its nodes end sooner
            ends = _PAIR_TAIL.finditer(data, match.start(4), match.end())
            end = next(item for k, item in enumerate(ends, start=1) if k == opens - 1).end()
            return {"fold": np.concatenate([_ints(match[2] + b"," + match[3]), tail[: opens - 1]])}, end
    if match := _INT_RE.match(data, pos):
        return int(match[0]), match.end()
    return None


def _skip(data: bytes, pos: int) -> int:
    return _WS.match(data, pos).end()  # type: ignore[union-attr]  # matches the empty string


def _tree(data: bytes, pos: int) -> tuple[Any, int]:
    """One tree from ``pos``: nodes opened on an explicit stack, closed as their ``]`` comes."""
    stack: list[tuple[bool, list[Any]]] = []
    while True:
        pos = _skip(data, pos)
        got = _quick(data, pos)
        if got is None:
            if match := _OPENS.match(data, pos):
                # not a fold of workers from here: every '[' opens a node of its own
                stack.extend((False, []) for _ in range(len(match[0])))
                pos = match.end()
            elif match := _FOLD_OPEN.match(data, pos):
                stack.append((True, []))
                pos = match.end()
            else:
                raise _error(f"Expecting {_NODE}", data, pos)
            continue
        value, pos = got
        while stack:
            stack[-1][1].append(value)
            pos = _skip(data, pos)
            if data.startswith(b",", pos):
                pos += 1
                break
            if not data.startswith(b"]", pos):
                raise _error("Expecting ',' or ']' in a tree", data, pos)
            is_fold, items = stack.pop()
            if len(items) < 2:
                raise _error(f"Expecting {_NODE}: this node has one item", data, pos)
            pos += 1
            if is_fold:
                if not (match := _FOLD_CLOSE.match(data, pos)):
                    raise _error("Expecting '}' after a fold's items", data, pos)
                pos = match.end()
            value = {"fold": items} if is_fold else items
        else:
            return value, pos


class _Stream:
    """A window onto the file: each item (a tree, a member's value) parsed once the window holds it
    whole, the window grown and retried where it did not, the parsed part dropped."""

    CHUNK: Final = 1 << 16

    def __init__(self, file: BinaryIO) -> None:
        self.file, self.data, self.base, self.eof, self.largest = file, b"", 0, False, 0

    def item(self, pos: int, parse: Callable[[bytes, int], tuple[Any, int]]) -> tuple[Any, int]:
        """``parse(window, pos)`` and the position after it and any space, where the window showed
        what follows (a truncated number or node is never taken); at the end of the file its error."""
        while not self.eof and len(self.data) - pos < 2 * self.largest:
            pos = self._more(pos)  # room for an item as large as the largest so far
        while True:
            try:
                value, end = parse(self.data, pos)
                end = _skip(self.data, end)
                if end < len(self.data) or self.eof:
                    self.largest = max(self.largest, end - pos)
                    return value, end
            except json.JSONDecodeError as exc:
                if self.eof:
                    self.file.seek(0)
                    raise _error(exc.msg, self.file.read(self.base + exc.pos), self.base + exc.pos) from None
            pos = self._more(pos)

    def _more(self, pos: int) -> int:
        """Drop the window before ``pos``, read a chunk more; ``pos`` is then 0."""
        more = self.file.read(self.CHUNK)
        self.base += pos
        self.data = self.data[pos:] + more
        self.eof = not more
        return 0

    def expect(self, pos: int, what: bytes, message: str) -> int:
        """The position after ``what`` (and any space), which must come at ``pos``."""

        def token(data: bytes, at: int) -> tuple[None, int]:
            if not data.startswith(what, at):
                raise _error(message, data, at)
            return None, at + len(what)

        return self.item(pos, token)[1]

    def next_item(self, pos: int, close: bytes, first: bool, between: str) -> tuple[bool, int]:
        """In an array or object: ``(True, after it)`` where ``close`` ends it at ``pos``, else
        ``(False, where its next item starts)``, past the ``,`` unless ``first``."""
        seen, pos = self.item(pos, lambda data, at: (data.startswith(close, at), at))
        if seen:
            return True, self.expect(pos, close, f"Expecting {close.decode()!r}")
        return False, pos if first else self.expect(pos, b",", between)


def _value(data: bytes, pos: int) -> tuple[Any, int]:
    """The JSON value at ``pos``, cut out by its tokens and read by ``json``."""
    end = _value_end(data, pos)
    try:
        return json.loads(data[pos:end]), end
    except json.JSONDecodeError as exc:
        raise _error(exc.msg, data, pos + exc.pos) from exc
    except RecursionError as exc:
        raise _error("a member other than trees nests too deep", data, pos) from exc


def _tree_or_null(data: bytes, pos: int) -> tuple[Any, int]:
    if data.startswith(b"null", pos):
        return None, pos + 4
    return _tree(data, pos)


def _trees(stream: _Stream, pos: int) -> tuple[list[Any], int]:
    """The ``trees`` array: a tree or ``null`` per element, each read once the window holds it."""
    pos = stream.expect(pos, b"[", "Expecting '[' (trees is an array)")
    trees: list[Any] = []
    while True:
        done, pos = stream.next_item(pos, b"]", not trees, "Expecting ',' or ']' between trees")
        if done:
            return trees, pos
        tree, pos = stream.item(pos, _tree_or_null)
        trees.append(tree)


def _value_end(data: bytes, pos: int) -> int:
    """Where the JSON value at ``pos`` ends, by its tokens and bracket depth (``json`` checks it)."""
    depth = 0
    while match := _TOKEN.match(data, pos):
        token, pos = match[0].strip(), match.end()
        depth += token in (b"[", b"{")
        depth -= token in (b"]", b"}")
        if depth <= 0 and token not in (b",", b":"):
            return pos
    raise _error("Expecting value", data, pos)


def reveal_document(file: BinaryIO) -> dict[str, Any]:
    """The JSON object a file (UTF-8) holds, read a window at a time, ``trees`` without recursion (a
    fold of workers as ``{"fold": array}``, whatever the version); raises
    :class:`json.JSONDecodeError` where it is not such an object.

    >>> from io import BytesIO
    >>> text = b'{"n": 3, "trees": [[[0, 1], 2], {"fold": [0, 1, 2]}, [0, [1, 2]], null]}'
    >>> doc = reveal_document(BytesIO(text))
    >>> doc["n"], [t["fold"].tolist() for t in doc["trees"][:2]], doc["trees"][2:]
    (3, [[0, 1, 2], [0, 1, 2]], [[0, [1, 2]], None])
    """
    stream = _Stream(file)
    pos = stream.expect(stream.item(0, _here)[1], b"{", "Expecting '{' (one JSON object)")
    doc: dict[str, Any] = {}
    while True:
        done, pos = stream.next_item(pos, b"}", not doc, "Expecting ',' delimiter")
        if done:
            stream.item(pos, _nothing)
            return doc
        key, pos = stream.item(pos, _value)
        if not isinstance(key, str):
            raise _error("Expecting property name enclosed in double quotes", stream.data, pos)
        pos = stream.expect(pos, b":", "Expecting ':' delimiter")
        doc[key], pos = _trees(stream, pos) if key == "trees" else stream.item(pos, _value)


def _here(data: bytes, pos: int) -> tuple[None, int]:
    return None, pos


def _nothing(data: bytes, pos: int) -> tuple[None, int]:
    """Nothing but space may follow the object."""
    if pos != len(data):
        raise _error("Extra data", data, pos)
    return None, pos
