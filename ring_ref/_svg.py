"""The SVG pictures, in one palette: the reference ring round by round, and revealed summation trees.

:func:`rounds_svg` draws a trace, one panel per round.  Each panel draws the
``N`` workers on a circle (worker 0 at the top, then clockwise), each as a row
of ``N`` chunk slots.  A slot's fill shows how many workers' contributions it
holds (pale: only its own, dark: all ``N``); a finished chunk also gets a thick
outline and a tick.  Arrows are the round's sends, labelled with the chunk and
``+`` (reduce-scatter adds) or ``=`` (all-gather copies); for another op
(clause ``op-trace``) the reduce-scatter arrows carry its sign instead:
``\u00d7`` (``prod``), ``\u2191`` (``max``: the larger is kept) or ``\u2193``
(``min``).  The first panel is the start state; the remaining reduce-scatter
panels fill the top row and the all-gather panels the bottom one; ``avg``'s
``divide`` step is one more panel at the end of the bottom row, every slot
marked ``\u00f7N``.

Every panel is a ``<g class="panel">`` with ``data-phase`` and ``data-round``;
every slot a ``<rect class="slot">`` with ``data-worker``, ``data-chunk`` and
``data-count``; every send a ``<path class="send">``.

:func:`reveal_svg` draws what ``ring-ref reveal`` found, one panel per
distinct tree: leaves are workers, every inner node one addition in the
dtype, filled like a slot holding as many contributions as the workers it adds.

:func:`invariance_svg` draws what ``ring-ref invariance`` found: a grid of
probed elements (columns) by placements (rows), each cell ``<rect
class="cell">`` (``data-element``, ``data-m``, ``data-offset``,
``data-tree``: the distinct tree's number, ``-1`` for none) filled by its
tree, from the same ramp, with a legend of the trees.

>>> from ring_ref._trace import trace
>>> svg = rounds_svg(trace(2))
>>> svg.startswith("<svg") and svg.count('class="panel"')
3
>>> rounds_svg(trace(2, op="avg")).count('data-phase="divide"')
1
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

from ring_ref._order import (
    Tree,
    display_tree,
    fold_order_of,
    format_tree,
    leaves,
    ring_step,
    tree_ids,
    tree_json_text,
)
from ring_ref._order_stability import Invariance
from ring_ref._reveal import Revealed
from ring_ref._trace import DIVIDE, RoundRecord, operation
from ring_ref.invariants import is_complete
from ring_ref.schedule import REDUCE_SCATTER

__all__ = ["invariance_svg", "reveal_svg", "rounds_svg", "slot_colour"]

SVG_NS = "http://www.w3.org/2000/svg"
SLOT = 16
PAD = 14
TITLE_H = 22

# The palette, one for both pictures.
_RAMP = ((255, 255, 204), (161, 218, 180), (65, 182, 196), (44, 127, 184), (37, 52, 148))
"""Contributions held (a slot's, or an addition's workers): pale for one, dark for all ``N``."""
_INK = "#555555"
"""Outlines: slots, tree edges and nodes."""
_SEND = "#b2182b"
"""Sends and their labels."""
_FINISHED = "#d95f02"
"""A finished chunk's outline."""
_PANEL = "#ffffff"
_PANEL_EDGE = "#bbbbbb"
_BACKGROUND = "#f7f7f7"
_RING = "#dddddd"
_SIGN = {"sum": "+", "avg": "+", "prod": "\u00d7", "max": "\u2191", "min": "\u2193"}
_MEANING = {
    "sum": "adds",
    "avg": "adds",
    "prod": "multiplies",
    "max": "keeps the larger (own only if own > incoming)",
    "min": "keeps the smaller (own only if own < incoming)",
}


def slot_colour(count: int, n: int) -> str:
    """The fill for a slot holding ``count`` of ``n`` contributions, pale (1) to dark (``n``).

    >>> slot_colour(1, 4), slot_colour(4, 4)
    ('#ffffcc', '#253494')
    """
    t = (len(_RAMP) - 1) * (0.0 if n == 1 else (count - 1) / (n - 1))
    k = min(int(t), len(_RAMP) - 2)
    lo, hi = _RAMP[k], _RAMP[k + 1]
    r, g, b = (round(a + (b - a) * (t - k)) for a, b in zip(lo, hi, strict=True))
    return f"#{r:02x}{g:02x}{b:02x}"


def _text_colour(count: int, n: int) -> str:
    return "#ffffff" if n > 1 and (count - 1) / (n - 1) > 0.5 else "#000000"


def _radius(n: int) -> float:
    """Circle radius at which neighbouring workers' slot rows do not overlap."""
    if n <= 2:
        return 80.0
    return max(80.0, (n * SLOT + 40) / (2 * math.sin(math.pi / n)))


def _centre(i: int, n: int, cx: float, cy: float, radius: float) -> tuple[float, float]:
    angle = -math.pi / 2 + 2 * math.pi * i / n
    return cx + radius * math.cos(angle), cy + radius * math.sin(angle)


def _edge(dx: float, dy: float, half_w: float, half_h: float) -> float:
    """Distance from a box centre along unit ``(dx, dy)`` to the box's edge."""
    tx = half_w / abs(dx) if dx else math.inf
    ty = half_h / abs(dy) if dy else math.inf
    return min(tx, ty)


def _fmt(v: float) -> str:
    return f"{v:.1f}"


def _add(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    el = ET.SubElement(parent, tag, {k.rstrip("_").replace("_", "-"): v for k, v in attrs.items()})
    if text is not None:
        el.text = text
    return el


def _panel(parent: ET.Element, rec: RoundRecord, x0: float, y0: float, size: float) -> None:
    n = len(rec.provenance)
    panel = _add(parent, "g", class_="panel", data_phase=rec.phase, data_round=str(rec.round))
    _add(
        panel,
        "rect",
        x=_fmt(x0),
        y=_fmt(y0),
        width=_fmt(size),
        height=_fmt(size + TITLE_H),
        rx="6",
        fill=_PANEL,
        stroke=_PANEL_EDGE,
    )
    if rec.phase == "start":
        title = "start"
    elif rec.phase == DIVIDE:
        title = f"divide by N = {n} (avg)"
    else:
        title = f"{rec.phase} round {rec.round} ({operation(rec.phase, rec.op)})"
    _add(panel, "text", title, x=_fmt(x0 + size / 2), y=_fmt(y0 + 16), class_="title")
    cx, cy, radius = x0 + size / 2, y0 + TITLE_H + size / 2, _radius(n)
    _add(panel, "circle", cx=_fmt(cx), cy=_fmt(cy), r=_fmt(radius), class_="ring")
    half_w, half_h = n * SLOT / 2 + 3, SLOT / 2 + 12
    for s in rec.sends:
        (ax, ay), (bx, by) = _centre(s.src, n, cx, cy, radius), _centre(s.dst, n, cx, cy, radius)
        length = math.hypot(bx - ax, by - ay)
        dx, dy = (bx - ax) / length, (by - ay) / length
        start = _edge(dx, dy, half_w, half_h) + 3
        end = _edge(dx, dy, half_w, half_h) + 6
        sx, sy, ex, ey = ax + dx * start, ay + dy * start, bx - dx * end, by - dy * end
        bow = 0.18 * length
        qx, qy = (sx + ex) / 2 - dy * bow, (sy + ey) / 2 + dx * bow
        _add(
            panel,
            "path",
            d=f"M {_fmt(sx)} {_fmt(sy)} Q {_fmt(qx)} {_fmt(qy)} {_fmt(ex)} {_fmt(ey)}",
            class_="send",
            data_src=str(s.src),
            data_dst=str(s.dst),
            data_chunk=str(s.chunk),
            marker_end="url(#arrow)",
        )
        op = _SIGN[rec.op] if s.phase == REDUCE_SCATTER else "="
        lx, ly = (sx + 2 * qx + ex) / 4, (sy + 2 * qy + ey) / 4
        _add(panel, "text", f"{op}c{s.chunk}", x=_fmt(lx - dy * 9), y=_fmt(ly + dx * 9 + 4), class_="label")
    for i, row in enumerate(rec.provenance):
        wx, wy = _centre(i, n, cx, cy, radius)
        left = wx - n * SLOT / 2
        _add(panel, "text", f"w{i}", x=_fmt(wx), y=_fmt(wy - SLOT / 2 - 4), class_="worker")
        for c, p in enumerate(row):
            done = is_complete(p, n)
            _add(
                panel,
                "rect",
                x=_fmt(left + c * SLOT),
                y=_fmt(wy - SLOT / 2),
                width=str(SLOT),
                height=str(SLOT),
                fill=slot_colour(len(p), n),
                class_="slot finished" if done else "slot",
                data_worker=str(i),
                data_chunk=str(c),
                data_count=str(len(p)),
            )
            mark = f"\u00f7{n}" if rec.phase == DIVIDE else "\u2713" if done else str(len(p))
            _add(
                panel,
                "text",
                mark,
                x=_fmt(left + c * SLOT + SLOT / 2),
                y=_fmt(wy + 4),
                class_="count",
                fill=_text_colour(len(p), n),
            )


_TEXT_STYLE = """
text { font-family: sans-serif; text-anchor: middle; }
.title { font-size: 13px; font-weight: bold; }
.worker { font-size: 11px; font-weight: bold; }
"""
_ROUNDS_STYLE = f"""{_TEXT_STYLE}.count {{ font-size: 9px; }}
.label {{ font-size: 10px; fill: {_SEND}; }}
.ring {{ fill: none; stroke: {_RING}; stroke-dasharray: 4 4; }}
.send {{ fill: none; stroke: {_SEND}; stroke-width: 1.6; }}
.slot {{ stroke: {_INK}; stroke-width: 0.8; }}
.finished {{ stroke: {_FINISHED}; stroke-width: 2.6; }}
.legend {{ font-size: 10px; text-anchor: start; }}
"""
_TREES_STYLE = f"""{_TEXT_STYLE}.heading {{ text-anchor: start; }}
.edge {{ stroke: {_INK}; stroke-width: 1.5; }}
.leaf, .addition {{ stroke: {_INK}; stroke-width: 0.8; }}
"""


def _legend(parent: ET.Element, n: int, op: str, x0: float, y0: float) -> None:
    legend = _add(parent, "g", class_="legend-box")
    lines = [
        f"w0..w{n - 1}: workers; each sends to the next, clockwise",
        f"its slots, left to right: chunks 0..{n - 1}",
        "slot fill and number: contributions held",
        "\u2713 + orange outline: finished chunk",
        f"arrow {_SIGN[op]}cK: send chunk K, receiver {_MEANING[op]}",
        "arrow =cK: send chunk K, receiver copies",
    ]
    if op == "avg":
        lines.append(f"\u00f7{n}: after all-gather, every slot divided by N once")
    for k, line in enumerate(lines):
        _add(legend, "text", line, x=_fmt(x0), y=_fmt(y0 + 14 * k), class_="legend")
    for count in range(1, n + 1):
        x = x0 + (count - 1) * (SLOT + 2)
        _add(
            legend,
            "rect",
            x=_fmt(x),
            y=_fmt(y0 + 14 * len(lines)),
            width=str(SLOT),
            height=str(SLOT),
            fill=slot_colour(count, n),
            stroke=_INK,
        )
        _add(
            legend,
            "text",
            str(count),
            x=_fmt(x + SLOT / 2),
            y=_fmt(y0 + 14 * len(lines) + SLOT / 2 + 4),
            class_="count",
            fill=_text_colour(count, n),
        )


def _document(width: float, height: float, title: str, style: str) -> tuple[ET.Element, ET.Element]:
    """An ``<svg>`` of ``width`` by ``height`` with its title, style and background; and its ``<defs>``."""
    root = ET.Element(
        "svg",
        {
            "xmlns": SVG_NS,
            "width": _fmt(width),
            "height": _fmt(height),
            "viewBox": f"0 0 {_fmt(width)} {_fmt(height)}",
        },
    )
    _add(root, "title", title)
    defs = _add(root, "defs")
    _add(defs, "style", style)
    _add(root, "rect", width="100%", height="100%", fill=_BACKGROUND)
    return root, defs


def _text(root: ET.Element) -> str:
    """The document as ASCII text: non-ASCII characters as character references."""
    ET.indent(root, space=" ")
    text = ET.tostring(root, encoding="unicode")
    return text.encode("ascii", "xmlcharrefreplace").decode("ascii") + "\n"


def rounds_svg(records: tuple[RoundRecord, ...]) -> str:
    """The SVG document (ASCII, non-ASCII text as character references) for a trace.

    The start panel comes first, then one panel per round (and for ``avg`` the ``divide`` step).
    """
    n = len(records[0].provenance)
    op = records[0].op
    size = 2 * _radius(n) + n * SLOT + 48
    columns = n + 1 if op == "avg" else n
    rows = 2 if n > 1 else 1
    width = columns * (size + PAD) + PAD
    height = rows * (size + TITLE_H + PAD) + PAD
    about = "" if op == "sum" else f", op {op}"
    root, defs = _document(
        width,
        height,
        f"Ring all-reduce, N = {n}{about}: every round of reduce-scatter and all-gather",
        _ROUNDS_STYLE,
    )
    marker = _add(
        defs,
        "marker",
        id="arrow",
        viewBox="0 0 10 10",
        refX="9",
        refY="5",
        markerWidth="5",
        markerHeight="5",
        orient="auto-start-reverse",
    )
    _add(marker, "path", d="M 0 0 L 10 5 L 0 10 z", fill=_SEND)
    for rec in records:
        if rec.phase == "start":
            column, row = 0, 0
        elif rec.phase == DIVIDE:
            column, row = n, rows - 1
        else:
            column, row = rec.round + 1, 0 if rec.phase == REDUCE_SCATTER else 1
        _panel(root, rec, PAD + column * (size + PAD), PAD + row * (size + TITLE_H + PAD), size)
    if n > 1:
        _legend(root, n, op, PAD + 8, PAD + size + TITLE_H + PAD + 24)
    return _text(root)


# --- the revealed trees -----------------------------------------------------------------------------

_LEAF_GAP = 30
_LEVEL = 26
_LEAF_R = 9
_ADDITION_R = 5

_Node = tuple[float, int, int, int | None]
"""A drawn node: ``x``, its height (additions below it), the workers it adds, and its worker if a leaf."""


def _place(tree: Tree, x: float, nodes: list[_Node], edges: list[tuple[_Node, _Node]]) -> tuple[_Node, float]:
    """Place ``tree``'s nodes and edges, its leftmost leaf at ``x``; its root, and the ``x`` after it."""
    if isinstance(tree, int):
        leaf = (x, 0, 1, tree)
        nodes.append(leaf)
        return leaf, x + _LEAF_GAP
    children = []
    for child in tree:
        placed, x = _place(child, x, nodes, edges)
        children.append(placed)
    node = (
        (children[0][0] + children[-1][0]) / 2,
        1 + max(c[1] for c in children),
        sum(c[2] for c in children),
        None,
    )
    nodes.append(node)
    edges += [(node, child) for child in children]
    return node, x


_DRAWN_LEAVES = 64
"""Trees of more leaves are drawn collapsed: a fold as its chain, any other tree by level."""


def _collapsed(tree: Tree, n: int) -> list[str]:
    """A large tree in a few lines: a fold's start, direction and end; else each depth's additions."""
    chain = fold_order_of(tree)
    if chain is not None:
        step = ring_step(chain) if len(chain) == n else 0
        how = f"steps {step:+d} around the ring" if step else "goes on in its own order"
        return [
            f"a fold (chain) of {len(chain)} workers: starts {chain[0]}, {chain[1]}, {how}, ends {chain[-1]}"
        ]
    lines: list[str] = []
    level, depth = [tree], 0
    while level and len(lines) < 16:
        inner = [node for node in level if not isinstance(node, int)]
        if inner:
            sizes: dict[tuple[int, int], int] = {}
            for node in inner:
                key = (len(leaves(node)), len(node))
                sizes[key] = sizes.get(key, 0) + 1
            shown = ", ".join(
                f"{count} x {size} leaves" + (f" ({terms} terms at once)" if terms > 2 else "")
                for (size, terms), count in sorted(sizes.items(), reverse=True)[:6]
            )
            lines.append(f"depth {depth}: {len(inner)} additions of {shown}")
        level, depth = [child for node in inner for child in node], depth + 1
    if level and len(lines) == 16:
        lines.append("... (deeper levels left out)")
    return lines


_PANELS = 256
"""The most distinct trees a reveal picture draws (the first ones; ``--json`` has every tree)."""


def _runs_by_tree(found: Revealed) -> dict[int, list[str]]:
    """Per distinct tree (its index in :meth:`Revealed.tree_index`, in the order of the first element
    that has it), the runs of elements that have it, as ``0..1`` or ``4``."""
    ids, _ = found.tree_index()
    spans: dict[int, list[str]] = {}
    for a, b, _ in found.runs():
        if ids[a] >= 0:
            spans.setdefault(int(ids[a]), []).append(f"{a}..{b}" if a != b else f"{a}")
    return spans


def _tree_panel(
    parent: ET.Element, found: Revealed, tree: Tree, spans: list[str], y0: float
) -> tuple[ET.Element, float, float]:
    """One tree's panel from ``y0``, titled with the first six of ``spans`` (the runs of elements
    that have it): its background ``<rect>`` (width set by the caller), width, height."""
    panel = _add(parent, "g", class_="tree", data_tree=tree_json_text(tree))
    box = _add(
        panel, "rect", x=_fmt(PAD), y=_fmt(y0), width="0", height="0", rx="6", fill=_PANEL, stroke=_PANEL_EDGE
    )
    heading = (
        "elements " + ", ".join(spans[:6]) + (", ..." if len(spans) > 6 else "") + ": " + format_tree(tree)
    )
    if len(heading) > 160:
        heading = heading[:157] + "..."
    _add(panel, "text", heading, x=_fmt(2 * PAD), y=_fmt(y0 + 16), class_="title heading")
    if len(leaves(tree)) > _DRAWN_LEAVES:
        lines = _collapsed(tree, found.n)
        for k, line in enumerate(lines):
            _add(panel, "text", line, x=_fmt(2 * PAD), y=_fmt(y0 + TITLE_H + 16 * (k + 1)), class_="title")
        tall = float(TITLE_H + 16 * len(lines) + PAD)
        box.set("height", _fmt(tall))
        return box, 8.0 * max(len(heading), *map(len, lines)) + 2 * PAD, tall
    nodes: list[_Node] = []
    edges: list[tuple[_Node, _Node]] = []
    root, right = _place(display_tree(tree), 2 * PAD + 20, nodes, edges)
    base = y0 + TITLE_H + PAD + root[1] * _LEVEL
    for (x1, h1, _, _), (x2, h2, _, _) in edges:
        _add(
            panel,
            "line",
            x1=_fmt(x1),
            y1=_fmt(base - h1 * _LEVEL),
            x2=_fmt(x2),
            y2=_fmt(base - h2 * _LEVEL),
            class_="edge",
        )
    for x, h, count, worker in nodes:
        fill = slot_colour(count, found.n)
        if worker is None:
            y = _fmt(base - h * _LEVEL)
            _add(panel, "circle", cx=_fmt(x), cy=y, r=str(_ADDITION_R), fill=fill, class_="addition")
            continue
        _add(panel, "circle", cx=_fmt(x), cy=_fmt(base), r=str(_LEAF_R), fill=fill, class_="leaf")
        _add(panel, "text", str(worker), x=_fmt(x), y=_fmt(base + 4), class_="worker")
    height = base + _LEAF_R + PAD - y0
    box.set("height", _fmt(height))
    return box, max(right, 8 * len(heading) + 2 * PAD), height


def reveal_svg(found: Revealed) -> str:
    """An SVG of the distinct trees, one panel each, titled with the elements that have it.

    Leaves are workers (bottom row); every inner node is one addition in the
    dtype, drawn above its two operands and filled as :func:`slot_colour`
    fills a slot holding as many contributions as the workers it adds.  Each
    panel is a ``<g class="tree">`` with ``data-tree`` (the ``--json`` spelling).

    >>> from ring_ref._reveal import reveal
    >>> svg = reveal_svg(reveal(lambda x: (x[0] + x[1]) + x[2], 3, 2, checks=1))
    >>> svg.startswith("<svg") and svg.count('class="tree"')
    1
    """
    panels = ET.Element("g")
    boxes: list[ET.Element] = []
    # runs of elements sharing a tree are one panel, titled with their runs (clause reveal-report)
    y, width = float(PAD), 2.0 * PAD + 200
    _, trees = found.tree_index()
    spans = _runs_by_tree(found)
    for k in list(spans)[:_PANELS]:
        box, panel_width, height = _tree_panel(panels, found, trees[k], spans[k], y)
        boxes.append(box)
        width = max(width, panel_width + 2 * PAD)
        y += height + PAD
    if len(spans) > _PANELS:
        more = f"... and {len(spans) - _PANELS} more distinct trees, not drawn (--json spells every one)"
        _add(panels, "text", more, x=_fmt(2 * PAD), y=_fmt(y + 16), class_="title heading")
        y += TITLE_H + PAD
    if not boxes:
        _add(panels, "text", "no element has a tree", x=_fmt(2 * PAD), y=_fmt(y + 16), class_="title heading")
        y += TITLE_H + PAD
    for box in boxes:
        box.set("width", _fmt(width - 2 * PAD))
    title = (
        f"ring-ref reveal {found.target} (N = {found.n}, M = {found.m}, {found.dtype}): the summation trees"
    )
    root, _ = _document(width, y, title, _TREES_STYLE)
    root.extend(panels)
    return _text(root)


# --- invariance: probed elements x placements -------------------------------------------------------

_CELL = 18
_LABEL_W = 150

_GRID_STYLE = f"""{_TEXT_STYLE}.heading, .placement, .tree-key {{ text-anchor: start; }}
.cell {{ stroke: {_INK}; stroke-width: 0.5; }}
"""


def invariance_svg(found: Invariance) -> str:
    """An SVG grid of the probed elements (columns) in every placement (rows), each cell coloured by its tree.

    The distinct trees are numbered in the order they first appear (row by
    row), coloured along the palette's ramp, and listed under the grid; a cell
    with no tree is white and marked ``-``.

    >>> from ring_ref._order_stability import invariance
    >>> svg = invariance_svg(invariance(lambda x: (x[0] + x[1]) + x[2], 3, [2, 4], probe=2, checks=1))
    >>> svg.count('class="cell"'), svg.count('class="tree-key"')
    (6, 1)
    """
    ids, distinct = tree_ids([tree for row in found.trees for tree in row])
    k, rows = found.probe, len(found.placements)
    width = max(
        _LABEL_W + k * _CELL + 2 * PAD,
        2 * PAD + 8 * max((len(format_tree(t)) for t in distinct), default=0) + 60,
        2 * PAD + 8 * len(found.summary_line()),
    )
    height = TITLE_H + PAD + rows * _CELL + PAD + (len(distinct) + 1) * 18 + PAD
    title = f"ring-ref invariance {found.target} (N = {found.n}, K = {k}, {found.dtype}): trees by placement"
    root, _ = _document(width, height, title, _GRID_STYLE)
    _add(root, "text", found.summary_line(), x=_fmt(PAD), y=_fmt(PAD + 8), class_="title heading")
    top = PAD + TITLE_H
    for r, placement in enumerate(found.placements):
        y = top + r * _CELL
        _add(root, "text", placement.text(), x=_fmt(PAD), y=_fmt(y + 13), class_="placement")
        for j in range(k):
            idx = int(ids[r * k + j])
            fill = "#ffffff" if idx < 0 else slot_colour(idx + 1, len(distinct))
            x = _LABEL_W + j * _CELL
            _add(
                root,
                "rect",
                x=_fmt(x),
                y=_fmt(y),
                width=str(_CELL),
                height=str(_CELL),
                fill=fill,
                class_="cell",
                data_element=str(j),
                data_m=str(placement.m),
                data_offset=str(placement.offset),
                data_tree=str(idx),
            )
            label = "-" if idx < 0 else str(idx)
            colour = "#000000" if idx < 0 else _text_colour(idx + 1, len(distinct))
            _add(root, "text", label, x=_fmt(x + _CELL / 2), y=_fmt(y + 13), fill=colour, class_="worker")
    y = top + rows * _CELL + PAD + 14
    for t, tree in enumerate(distinct):
        _add(
            root,
            "rect",
            x=_fmt(PAD),
            y=_fmt(y - 11),
            width="12",
            height="12",
            fill=slot_colour(t + 1, len(distinct)),
        )
        _add(root, "text", f"{t}: {format_tree(tree)}", x=_fmt(PAD + 18), y=_fmt(y), class_="tree-key")
        y += 18
    return _text(root)
