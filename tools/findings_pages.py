"""The findings catalogue's writer and checker: results of ``tools/findings.py`` to ``docs/findings/``.

Pure functions, no process: a result of the command line (``reveal --json``, ``difftest --json``,
``invariance --json``) becomes a *finding* (:func:`cell`, :func:`invariance_entry`); the findings become
``findings.json`` (``spec/findings.schema.json``, checked by :func:`problems`), one Markdown page per
library and an index (:func:`write`).  :func:`differences` compares a new reveal with a committed finding
(the pinned findings' oracle is the committed file, made from the real library).  Output is
deterministic: sorted, and the date of the run is written once per page and once in the JSON.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import jsonschema  # type: ignore[import-untyped]

from ring_ref._order import format_tree, tree_from_json

ROOT: Final = Path(__file__).resolve().parent.parent
SCHEMA: Final = ROOT / "spec" / "findings.schema.json"
MAX_RUNS: Final = 256  # runs of equal trees kept per finding; beyond, the hash of all trees still pins them
SHOWN_RUNS: Final = 4  # runs spelt on the page per finding
FORMAT: Final = "ring-ref-findings"


def _trees_key(trees: Sequence[Any]) -> str:
    return hashlib.sha256(json.dumps(list(trees), sort_keys=True).encode()).hexdigest()


def runs(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Consecutive elements with one tree (``null`` where reveal found none), each with its text.

    >>> doc = {"n": 2, "m": 3, "trees": [[0, 1], [0, 1], None]}
    >>> [(r["first"], r["last"], r["text"]) for r in runs(doc)]
    [(0, 1, 'fold 0,1'), (2, 2, 'no tree')]
    """
    found: list[dict[str, Any]] = []
    for element, tree in enumerate(document["trees"]):
        if found and found[-1]["tree"] == tree:
            found[-1]["last"] = element
            continue
        text = "no tree" if tree is None else format_tree(tree_from_json(tree, document["n"]))
        found.append({"first": element, "last": element, "tree": tree, "text": text})
    return found


def _signature(document: dict[str, Any]) -> str:
    """What kind of order a reveal found, independent of the size: a ring's direction and offset (its
    layout follows from ``M``), else the set of distinct trees."""
    ring = document["ring"]
    if ring is not None:
        return f"ring (direction {ring['direction']:+d}, offset {ring['offset']})"
    distinct = sorted({r["text"] for r in runs(document)})
    shown = "; ".join(distinct[:3]) + ("; ..." if len(distinct) > 3 else "")
    return f"{document['classification']}: {len(distinct)} distinct tree(s): {shown}"


def scan_point(m: int, result: dict[str, Any]) -> dict[str, Any]:
    """One size of the switch-point scan: the kind of order the default sums in there."""
    document = result["json"]
    kind = "failed: " + _first_line(result["error"]) if document is None else _signature(document)
    return {"m": m, "kind": kind, "svg": result.get("svg", "")}


def switch_sizes(scans: Iterable[dict[str, Any]]) -> list[list[int]]:
    """The pairs of neighbouring scanned sizes between which the kind of order changes, at any scanned ``N``.

    >>> scans = [{"n": 3, "sizes": [{"m": 7, "kind": "a"}, {"m": 64, "kind": "a"}, {"m": 256, "kind": "b"}]}]
    >>> switch_sizes(scans)
    [[64, 256]]
    """
    pairs = set()
    for scan in scans:
        sizes = scan["sizes"]
        for before, after in itertools.pairwise(sizes):
            if before["kind"] != after["kind"]:
                pairs.add((before["m"], after["m"]))
    return [list(pair) for pair in sorted(pairs)]


def row_sizes(n: int, switches: Sequence[Sequence[int]], large: int) -> list[int]:
    """The sizes of one row: ``2N + 1`` (not a multiple of ``N``) and both sides of each switch point;
    without one, ``large`` too.  A scanned ``2N + 1`` of another ``N`` stays that ``N``'s own.

    >>> row_sizes(3, [[64, 256]], 4096), row_sizes(5, [], 4096), row_sizes(5, [[9, 64]], 4096)
    ([7, 64, 256], [11, 4096], [11, 64])
    """
    sides = {m for pair in switches for m in pair if m >= 64}  # 64: the ladder's first size
    return sorted({2 * n + 1, *(sides or {large})})


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


def _certification(result: dict[str, Any] | None) -> dict[str, Any] | None:
    if result is None:
        return None
    report = result["json"]
    if report is None:
        return {"verdict": "error", "summary": _first_line(result["error"])}
    return {"verdict": report["verdict"], "summary": report["summary"]}


def cell(
    algorithm: str,
    settings: dict[str, str],
    n: int,
    m: int,
    *,
    revealed: dict[str, Any],
    certified: dict[str, Any] | None,
) -> dict[str, Any]:
    """One finding: what reveal found for one algorithm at ``(N, M)`` and whether difftest certified it."""
    document = revealed["json"]
    base: dict[str, Any] = {
        "algorithm": algorithm,
        "settings": dict(sorted(settings.items())),
        "n": n,
        "m": m,
    }
    if document is None:
        return {**base, "status": "failed", "error": _first_line(revealed["error"])}
    found = runs(document)
    return {
        **base,
        "status": "revealed",
        "classification": document["classification"],
        "ring": document["ring"],
        "matches": sorted(document["matches"]),
        "trees_sha256": _trees_key(document["trees"]),
        "runs": found[:MAX_RUNS],
        "runs_total": len(found),
        "svg": revealed.get("svg", ""),
        "certified": _certification(certified),
    }


def invariance_entry(algorithm: str, n: int, sizes: Sequence[int], result: dict[str, Any]) -> dict[str, Any]:
    """``invariance``'s verdict over one row's sizes (and every chunk's offsets)."""
    report = result["json"]
    base: dict[str, Any] = {"algorithm": algorithm, "n": n, "sizes": list(sizes)}
    if report is None:
        return {**base, "status": "failed", "error": _first_line(result["error"])}
    return {**base, "status": "ran", "invariant": report["invariant"], "summary": report["summary"]}


def load(path: Path) -> dict[str, Any]:
    """The committed catalogue, or an empty one."""
    if path.exists():
        document: dict[str, Any] = json.loads(path.read_text())
        return document
    return {"format": FORMAT, "version": 1, "generated": "", "libraries": {}}


def merge(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """A library's entry after a partial run: the new cells and verdicts replace the same
    ``(algorithm, N, M)`` of the old, the others stay."""
    if old is None:
        return new

    def keep(key: Any, items: list[dict[str, Any]], fresh: list[dict[str, Any]]) -> list[dict[str, Any]]:
        replaced = {key(item) for item in fresh}
        return [item for item in items if key(item) not in replaced] + fresh

    merged = dict(new)
    merged["cells"] = keep(lambda c: (c["algorithm"], c["n"], c["m"]), old["cells"], new["cells"])
    merged["invariance"] = keep(lambda c: (c["algorithm"], c["n"]), old["invariance"], new["invariance"])
    return merged


def _order_key(library: dict[str, Any]) -> Any:
    names = library["algorithms"]

    def key(item: dict[str, Any]) -> tuple[int, int, int]:
        rank = names.index(item["algorithm"]) if item["algorithm"] in names else len(names)
        return rank, item["n"], item.get("m", 0)

    return key


def normalised(document: dict[str, Any]) -> dict[str, Any]:
    """The catalogue sorted (libraries by key, findings by algorithm as the library lists them, N, M)."""
    libraries = {}
    for key in sorted(document["libraries"]):
        library = dict(document["libraries"][key])
        library["cells"] = sorted(library["cells"], key=_order_key(library))
        library["invariance"] = sorted(library["invariance"], key=_order_key(library))
        libraries[key] = library
    return {**document, "libraries": libraries}


def problems(document: dict[str, Any]) -> list[str]:
    """Why ``document`` is not a catalogue: the schema's errors, then what the schema cannot say (each
    finding's runs cover ``0 .. M - 1`` in order; a named preset comes with a certification)."""
    schema = json.loads(SCHEMA.read_text())
    found = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft202012Validator(schema).iter_errors(document)
    ]
    if found:
        return found
    for key, library in document["libraries"].items():
        for c in library["cells"]:
            where = f"{key} {c['algorithm']} N={c['n']} M={c['m']}"
            if c["status"] != "revealed":
                continue
            spans = [(r["first"], r["last"]) for r in c["runs"]]
            expected_next = 0
            for first, last in spans:
                if first != expected_next or last < first:
                    found.append(f"{where}: the runs do not cover the elements in order at {first}..{last}")
                    break
                expected_next = last + 1
            complete = c["runs_total"] == len(c["runs"])
            if complete and expected_next != c["m"]:
                found.append(f"{where}: the runs cover {expected_next} of {c['m']} elements")
            if c["matches"] and c["certified"] is None:
                found.append(f"{where}: presets named without a certification")
    return found


def differences(finding: dict[str, Any], document: dict[str, Any]) -> list[str]:
    """How a reveal (``reveal --json``) differs from a committed finding of the same ``(N, M)``: empty
    when the library still sums in the committed order."""
    if finding["status"] != "revealed":
        return [f"the finding is {finding['status']}: {finding.get('error', '')}"]
    got = {
        "classification": document["classification"],
        "ring": document["ring"],
        "matches": sorted(document["matches"]),
        "trees_sha256": _trees_key(document["trees"]),
    }
    return [f"{k}: committed {finding[k]!r}, revealed now {v!r}" for k, v in got.items() if finding[k] != v]


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _order_text(c: dict[str, Any]) -> str:
    if c["status"] != "revealed":
        return f"**{c['status']}**: {_escape(c['error'])}"
    ring = c["ring"]
    head = str(c["classification"])
    if ring is not None:
        head = f"ring (direction {ring['direction']:+d}, offset {ring['offset']}, layout {ring['layout']})"
    shown = [f"{r['first']}..{r['last']}: {r['text']}" for r in c["runs"][:SHOWN_RUNS]]
    if c["runs_total"] > SHOWN_RUNS:
        shown.append(f"... ({c['runs_total']} runs in all)")
    return head + "<br>" + "<br>".join(f"`{_escape(s)}`" for s in shown)


def _certified_text(c: dict[str, Any]) -> str:
    certified = c.get("certified")
    if certified is None:
        return "—"
    if certified["verdict"] == "pass":
        return "pass"
    return f"{certified['verdict']}: {_escape(certified['summary'])}"


def _svg_link(item: dict[str, Any]) -> str:
    return f"[svg](svg/{item['svg']})" if item.get("svg") else "—"


def _settings_text(settings: dict[str, str]) -> str:
    return " ".join(f"`{k}={v}`" for k, v in settings.items()) or "(none: the library's default)"


def _not_run(library: dict[str, Any]) -> list[tuple[str, list[int]]]:
    """Each algorithm and the planned ``N`` it has no finding at."""
    missing = []
    for algorithm in library["algorithms"]:
        done = {c["n"] for c in library["cells"] if c["algorithm"] == algorithm}
        left = [n for n in library["n_planned"] if n not in done]
        if left:
            missing.append((algorithm, left))
    return missing


def library_page(library: dict[str, Any]) -> str:
    """One library's page: versions, machine, the command, the switch points and every finding."""
    lines = [
        f"# {library['title']}: the order of each all-reduce algorithm",
        "",
        f"Generated {library['generated']} by `{library['command']}` "
        "(float32; see the [catalogue](index.md)).",
        "",
        "| | |",
        "|---|---|",
        f"| library | {_escape(library['library'] or library['title'])} |",
        f"| pip | {library['pip']} |",
        f"| installed by | `{library['install']}` |",
        f"| machine | {library['machine']} |",
        f"| algorithm variable | {library['variable'] or '(none: the default only)'} |",
        f"| algorithms | {', '.join(library['algorithms'])} |",
        f"| regenerate | `{library['command']}` |",
        "",
    ]
    if library["algorithms_error"]:
        lines += [f"Listing the algorithms failed: {library['algorithms_error']}", ""]
    lines += ["## Switch points of the default", ""]
    lines += ["The default revealed at each size; a change of kind between two sizes is a switch point.", ""]
    lines += ["| N | M | order | trees |", "|---|---|---|---|"]
    lines += [
        f"| {s['n']} | {p['m']} | {_escape(p['kind'])} | {_svg_link(p)} |"
        for s in library["scan"]
        for p in s["sizes"]
    ]
    switches = ", ".join(f"between M = {a} and {b}" for a, b in library["switches"]) or "none found"
    lines += ["", f"Switch points: {switches}.", "", "## Findings", ""]
    missing = _not_run(library)
    if missing:
        lines += ["Not run yet (the run was cut short; `make findings` resumes it):", ""]
        lines += [f"- {algorithm}: N = {', '.join(map(str, ns))}" for algorithm, ns in missing]
        lines.append("")
    verdicts = {(v["algorithm"], v["n"]): v for v in library["invariance"]}
    for algorithm in library["algorithms"]:
        cells = [c for c in library["cells"] if c["algorithm"] == algorithm]
        if not cells:
            continue
        lines += [f"### {algorithm}", "", f"Settings: {_settings_text(cells[0]['settings'])}", ""]
        lines += [
            "| N | M | order (trees by element) | preset | certified | trees |",
            "|---|---|---|---|---|---|",
        ]
        for c in cells:
            preset = ", ".join(c.get("matches", [])) or "no preset"
            svg = _svg_link(c)
            lines.append(
                f"| {c['n']} | {c['m']} | {_order_text(c)} | {preset} | {_certified_text(c)} | {svg} |"
            )
        lines += ["", "Invariance over the row's sizes and every chunk's offsets:", ""]
        for n in sorted({c["n"] for c in cells}):
            v = verdicts.get((algorithm, n))
            if v is None:
                lines.append(f"- N = {n}: not run")
            elif v["status"] != "ran":
                lines.append(f"- N = {n}: failed: {_escape(v['error'])}")
            else:
                word = "invariant" if v["invariant"] else "**not invariant**"
                lines.append(f"- N = {n}: {word}: {_escape(v['summary'])}")
        lines.append("")
    return "\n".join(lines)


def index_page(document: dict[str, Any]) -> str:
    """The catalogue's index: one line per library, what its default is, how much was run."""
    lines = [
        "# The findings catalogue",
        "",
        f"Generated {document['generated']} by `make findings`"
        " (spec: [the findings catalogue](../spec/findings.md)).",
        "Each library's page holds every algorithm revealed at N = 2..8 and at sizes either side of its",
        "switch points, each file certified by `difftest --mode exact --order`, and `invariance` over the",
        "sizes; [findings.json](findings.json) holds the same (`spec/findings.schema.json`).",
        "",
        "| library | version | default at N = 3, 4 (smallest M) | findings | failed |",
        "|---|---|---|---|---|",
    ]
    for key, library in document["libraries"].items():
        defaults = []
        for n in (3, 4):
            first = next((c for c in library["cells"] if c["algorithm"] == "default" and c["n"] == n), None)
            if first is not None and first["status"] == "revealed":
                defaults.append(", ".join(first["matches"]) or f"no preset ({first['classification']})")
        failed = sum(c["status"] != "revealed" for c in library["cells"])
        lines.append(
            f"| [{library['title']}]({key}.md) | {_escape(library['library'] or library['pip'])} | "
            f"{'; '.join(defaults) or '—'} | {len(library['cells'])} | {failed} |"
        )
    return "\n".join(lines) + "\n"


def write(document: dict[str, Any], out: Path) -> None:
    """``findings.json``, the index and one page per library into ``out``; refuses a bad catalogue."""
    document = normalised(document)
    found = problems(document)
    if found:
        raise ValueError("not a findings catalogue: " + "; ".join(found[:5]))
    (out / "findings.json").write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    (out / "index.md").write_text(index_page(document))
    for key, library in document["libraries"].items():
        (out / f"{key}.md").write_text(library_page(library) + "\n")
    drawn = {
        item["svg"]
        for library in document["libraries"].values()
        for item in [*library["cells"], *(p for s in library["scan"] for p in s["sizes"])]
        if item.get("svg")
    }
    for stale in sorted((out / "svg").glob("*.svg")) if (out / "svg").is_dir() else []:
        if stale.name not in drawn:
            stale.unlink()  # a drawing no finding names any more
