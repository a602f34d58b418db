"""``make mutation``'s configuration stays true to the tree: files exist, equivalents name real code."""

from __future__ import annotations

import fnmatch
import inspect
import keyword
import re
from typing import Any

from tests.common.dotted import resolve
from tests.common.paths import ROOT
from tools import mutation


def test_every_mutated_file_and_every_test_path_exists() -> None:
    for name, (files, tests) in mutation.MODULES.items():
        for pattern in files:
            assert list(ROOT.glob(pattern)), (name, pattern)
        for test in tests:
            path, _, node = test.partition("::")
            function = node.partition("[")[0]  # a parametrized test's id names its parameter
            assert (ROOT / path).exists(), (name, test)
            assert not function or f"\ndef {function}(" in (ROOT / path).read_text(encoding="utf-8"), (
                name,
                test,
            )


def test_a_section_of_a_test_file_runs_from_its_first_test_to_the_end() -> None:
    path = "tests/cover/test_mutation_config.py"
    names = re.findall(r"^def (test_\w+)\(", (ROOT / path).read_text(encoding="utf-8"), re.MULTILINE)
    assert mutation.tests_from(path, names[2]) == tuple(f"{path}::{name}" for name in names[2:])
    assert mutation.tests_from(path, names[0]) == tuple(f"{path}::{name}" for name in names)


def test_every_equivalent_mutant_names_a_function_and_a_line_of_it() -> None:
    rows = mutation.read_equivalents()
    assert rows, "the table parsed to nothing"
    for row in rows:
        function: Any = resolve(row.function)
        assert row.reason and row.line, row
        # The line is a mutation of the function: it shares a word (not a keyword) with its source, in
        # any case (mutmut upper-cases strings).
        words = set(re.findall(r"[a-z_]\w*", inspect.getsource(function).lower())) - set(keyword.kwlist)
        assert words & set(re.findall(r"[a-z_]\w*", row.line.lower())), row


def test_mutated_line_finds_the_changed_line_of_a_mutant() -> None:
    source = (
        "def x_f__mutmut_orig(a):\n    b = a + 1\n    return b\n"
        "def x_f__mutmut_3(a):\n    b = a - 1\n    return b\n"
        "def x_f__mutmut_4(a):\n    b = a + 1\n"
        "def x_f__mutmut_5(a=2):\n    b = a + 1\n    return b\n"
    )
    assert mutation.mutated_line(source, "x_f", "3") == "b = a - 1"
    assert mutation.changed_lines(source, "x_f", "3") == ("b = a + 1", "b = a - 1")
    assert mutation.changed_lines(source, "x_f", "4") == ("return b", "(deleted) return b")
    assert mutation.mutated_line(source, "x_f", "4") == "(deleted) return b"
    assert mutation.mutated_line(source, "x_f", "5") == "def f(a=2):"
    method = (
        "class C:\n"
        "    def xǁCǁg__mutmut_orig(self):\n        return 1\n"
        "    def xǁCǁg__mutmut_1(self):\n        return 2\n"
    )
    assert mutation.mutated_line(method, "xǁCǁg", "1") == "return 2"
    assert mutation.mutated_line(source, "x_f", "9") == "?"


def test_rows_no_surviving_mutant_matched_are_reported_stale() -> None:
    kept = mutation.Equivalent("ring_ref.core.run_ring", "a = 1", "same")
    killed = mutation.Equivalent("ring_ref.core.initial_state", "b = 2", "same")
    elsewhere = mutation.Equivalent("ring_ref.invariants.arc", "c = 3", "same")
    survivor = mutation.Mutant("ring_ref.core.x_run_ring__mutmut_1", "survived", kept.function, kept.line)
    score = mutation.ModuleScore("core", 1.0, mutants=[survivor], equivalent=[survivor])
    assert mutation.stale_equivalents("core", score, [kept, killed, elsewhere]) == [killed]


def test_a_function_selection_picks_exactly_that_functions_mutants() -> None:
    names = [  # as mutmut 3 names them: x_ before a function, xǁClassǁ before a method
        "ring_ref.difftest._search.x__replay__mutmut_3",
        "ring_ref.difftest._search.x__replay__mutmut_12",
        "ring_ref.difftest._search.x__replay_line__mutmut_1",
        "ring_ref.difftest._search.x_search_replay__mutmut_2",
        "ring_ref.difftest._worker.xǁWorkerǁpoll__mutmut_15",
        "ring_ref.difftest._worker.xǁWorkerǁpoll_all__mutmut_1",
        "ring_ref.difftest._worker.x_poll__mutmut_4",
    ]

    def picked(sample: str, functions: list[str]) -> list[str]:
        patterns = mutation.selection(sample, functions)
        return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]

    assert mutation.selection() == []  # a complete run
    assert picked("", ["_replay"]) == names[:2]
    assert picked("2", ["_replay"]) == names[1:2]
    assert picked("", ["poll"]) == [names[4], names[6]]
    assert picked("5", []) == [names[4]]
