"""Mutation testing with mutmut, one module at a time (``make mutation``; soak-style, not in ``make verify``).

For each module in :data:`MODULES` this copies the committed tree (``git archive
HEAD``) into a fresh temporary directory, configures
mutmut there to mutate only that module and to run only the module's fast tests
(``tests/cover/...`` plus the module's doctests), runs it, and prints the score
``killed / (mutants - equivalent)`` and every surviving mutant with its mutated
line.  Nothing is written into the repository; the shared tree is never
mutated in place.

A mutant judged *equivalent* (no test could tell it apart, because it computes
the same thing) is listed in ``tests/mutation/equivalent.md`` as a table row
``| module.function | mutated line | reason |``; it is matched by function and
mutated line, not by mutmut's mutant number, so the list survives unrelated edits.

The run fails (exit 1) when a module scores below :data:`TARGET`.

Usage::

    python tools/mutation.py                    # every module
    python tools/mutation.py core invariants    # some of them
    python tools/mutation.py --sample 0 fast    # the mutants numbered *0: a tenth

Each run is single-threaded and deselects the ``soak`` and ``gpu`` tests.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Final, NamedTuple

ROOT: Final = Path(__file__).resolve().parent.parent
EQUIVALENT: Final = ROOT / "tests" / "mutation" / "equivalent.md"
TARGET: Final = 0.95
MAX_CHILDREN: Final = 2
EXTRA_DIRS: Final = ("spec", "tools", "examples", "docs", "bench", "README.md", "Makefile", "constraints.txt")
"""Copied next to the mutated package as well: tests read the spec, the README and the docs and use tools/."""


def tests_from(path: str, first: str) -> tuple[str, ...]:
    """The test functions of ``path`` from ``first`` to the end of the file, as pytest node IDs.

    A module's fast tests when its test file also holds slower ones (property tests, tests that run
    targets): they are the file's last section, so its mutants are not run against the slow part.
    """
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    names = [
        node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    ]
    return tuple(f"{path}::{name}" for name in names[names.index(first) :])


RANKS_TESTS: Final = tests_from(
    "tests/nocover/test_difftest_ranks.py",
    "test_every_rank_answers_on_a_loopback_group_reused_per_n_until_closed",
)
"""The gloo rank launcher's tests on real groups of forked ranks (seconds per mutant)."""

DIAGNOSIS_TESTS: Final = tests_from(
    "tests/cover/difftest/test_diagnosis.py",
    "test_a_call_that_did_not_answer_is_its_failure_with_stack_and_ranks",
)
"""The diagnosis' fast tests (the file's last section): outcomes built by hand, targets run in pytest."""

SEARCH_TESTS: Final = tests_from(
    "tests/cover/difftest/test_search.py",
    "test_a_passing_mode_counts_every_call_and_runs_the_one_worker_cases_first",
)
"""The search's fast tests (the file's last section): scripted launchers, ``zero_out`` with predicates."""

RUN_TESTS: Final = (
    "tests/cover/difftest/test_run.py",
    # the orders a run checks exact against: saved files read and refused, auto revealed (under a second each)
    *(
        f"tests/cover/difftest/test_orders.py::{name}"
        for name in (
            "test_order_file_records_an_order_and_catches_a_changed_one",
            "test_order_files_that_cannot_serve_are_refused",
            "test_an_order_file_refuses_options_its_inputs_would_break",
            "test_schedule_auto_reveals_a_function_in_this_process",
            "test_schedule_auto_reveals_with_the_ranks_environment",
            *(f"test_order_files_of_every_version_conform_and_check_exact[{v}]" for v in (1, 2, 3)),
        )
    ),
    # an MPI job of one rank (seconds): the run inside it (see FORKED)
    "tests/nocover/test_difftest_job.py::test_an_mpi_job_of_one_rank_ends_a_call_at_the_time_limit_asked",
)
"""The run's tests: options refused, launchers chosen, reports and replay lines (targets in pytest's process,
workers, stand-ins for the rank launchers, a world of one rank), and the order files and auto reveals that
reach it."""

BACKEND_TESTS: Final = tuple(
    f"tests/nocover/test_backend.py::{name}"
    for name in (
        "test_every_reduction_matches_the_stacked_reference",
        "test_every_data_collective_gives_gloos_bits",
        "test_differing_orders_are_refused_on_every_rank_when_the_group_is_made",
        # parametrized: mutmut matches the ids it collected, so each is named with its parameter
        "test_coalesced_calls_any_source_receives_and_bad_sizes_on_every_rank[spec]",
        "test_coalesced_calls_any_source_receives_and_bad_sizes_on_every_rank[chain]",
        "test_destroying_a_group_releases_its_inner_gloo_group",
        "test_a_group_of_some_ranks_reduces_over_its_own_ranks_only",
    )
)
"""The backend's collectives on a module's world of three spawned ranks (its fixture spawns them, so that
they import the mutated package with the mutant's environment)."""

MODULES: Final[dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {
    # name: (files mutated, tests run: fast test files, or a file's fast last section, and doctests)
    "schedule": (
        ("ring_ref/schedule.py",),
        (
            "ring_ref/schedule.py",
            "tests/cover/test_spec_clauses.py",
            "tests/cover/test_invariants.py",
            "tests/cover/test_schedules.py",
        ),
    ),
    "core": (
        ("ring_ref/core.py",),
        (
            "ring_ref/core.py",
            "tests/cover/test_invariants.py",
            "tests/cover/test_stateful.py",
            "tests/cover/test_core.py",
            "tests/cover/test_schedules.py",
        ),
    ),
    "invariants": (
        ("ring_ref/invariants.py",),
        (
            "ring_ref/invariants.py",
            "tests/cover/test_invariants.py",
            "tests/cover/test_spec_clauses.py",
            "tests/cover/test_schedules.py",
        ),
    ),
    "validate": (
        ("ring_ref/_validate.py",),
        (
            "ring_ref/_validate.py",
            "tests/cover/test_bad_input.py",
            "tests/cover/test_adapters.py",
            "tests/cover/test_validate.py",
            "tests/cover/test_schedules.py",
        ),
    ),
    # The per-rank rows of the table, split from _validate: the same fast tests kill their mutants.
    "ranks.rules": (
        ("ring_ref/_ranks/_rules.py",),
        (
            "ring_ref/_ranks/_rules.py",
            "tests/cover/test_bad_input.py",
            "tests/cover/test_adapters.py",
            "tests/cover/test_validate.py",
        ),
    ),
    # The backend: its order check and op refusal in one process, and every collective of its groups on
    # three spawned gloo ranks (BACKEND_TESTS; seconds per mutant, see FORKED).
    "ranks.backend": (
        ("ring_ref/_ranks/_backend.py",),
        ("ring_ref/_ranks/_backend.py", "tests/cover/test_backend.py", *BACKEND_TESTS),
    ),
    "adapters": (
        ("ring_ref/_torch_adapter.py", "ring_ref/_numpy_adapter.py"),
        (
            "ring_ref/_torch_adapter.py",
            "ring_ref/_numpy_adapter.py",
            "tests/cover/test_properties.py",
            "tests/cover/test_ops.py",
            "tests/cover/test_schedules.py",
            "tests/cover/test_bad_input.py",
            "tests/cover/test_adapters.py",
        ),
    ),
    "ops": (
        ("ring_ref/_ops.py",),
        ("ring_ref/_ops.py", "tests/cover/test_ops.py"),
    ),
    "chunks": (
        ("ring_ref/_chunks.py",),
        ("ring_ref/_chunks.py", "tests/cover/test_chunks.py", "tests/cover/test_schedules.py"),
    ),
    "dtypes": (("ring_ref/_dtypes.py",), ("ring_ref/_dtypes.py", "tests/cover/test_dtypes.py")),
    "cost": (("ring_ref/_cost.py",), ("ring_ref/_cost.py", "tests/cover/test_cost.py")),
    # The fast engine and its compiled kernel: their tests on small inputs (the property tests of
    # tests/cover/test_fast*.py take minutes per mutant).  The kernel's Python is plain code: mutants of its
    # IR text are compiled by llvmlite in the test run like the original.
    "fast": (
        ("ring_ref/_fast/_plan.py", "ring_ref/_fast/_run.py", "ring_ref/_fast/_forward.py"),
        (
            "ring_ref/_fast/__init__.py",
            "ring_ref/_fast/_plan.py",
            "ring_ref/_fast/_run.py",
            "ring_ref/_fast/_forward.py",
            *tests_from("tests/cover/test_fast.py", "test_every_op_dtype_and_layout_equals_the_reference"),
            # the chain's, recursive doubling's and the two collectives' paths (seconds each)
            "tests/cover/test_chain.py",
            "tests/cover/test_doubling.py",
            "tests/cover/test_collectives.py",
        ),
    ),
    "kernel": (
        ("ring_ref/_fast/_kernel.py",),
        ("ring_ref/_fast/_kernel.py", "tests/cover/test_kernel.py"),
    ),
    # difftest, one module at a time, with the fast in-process tests of that module (the tests of diagnosis,
    # search and ops, which check each module through the others too, take some 15 s per mutant)
    "difftest.oracles": (
        ("ring_ref/difftest/_oracles.py",),
        (
            "ring_ref/difftest/_oracles.py",
            "tests/cover/difftest/test_oracles.py",
        ),
    ),
    "difftest.inputs": (
        ("ring_ref/difftest/_inputs.py",),
        (
            "ring_ref/difftest/_inputs.py",
            "tests/cover/difftest/test_inputs.py",
        ),
    ),
    # The report built by hand, no target run (the difftest tests above take some 15 s per mutant).
    "difftest.report": (
        ("ring_ref/difftest/_report.py",),
        (
            "ring_ref/difftest/_report.py",
            *tests_from("tests/cover/difftest/test_report.py", "test_a_passing_mode_reports_its_counts_only"),
        ),
    ),
    # The order probes: the probes against every tree of 4 and 5 workers, and exact runs in pytest's process.
    "difftest.probes": (
        ("ring_ref/difftest/_probes.py",),
        ("ring_ref/difftest/_probes.py", "tests/cover/difftest/test_probes.py"),
    ),
    "difftest.vocabulary": (
        ("ring_ref/difftest/_vocabulary.py",),
        ("ring_ref/difftest/_vocabulary.py", "tests/cover/difftest/test_vocabulary.py"),
    ),
    # The verdict and the diagnosis' probes: the diagnosis' kill tests, outcomes built by hand and targets
    # run in pytest's process; the option rules and the launcher table: the search's kill tests.
    "difftest.verdict": (
        ("ring_ref/difftest/_verdict.py",),
        ("ring_ref/difftest/_verdict.py", *DIAGNOSIS_TESTS),
    ),
    "difftest.diagnosis_probes": (
        ("ring_ref/difftest/_diagnosis_probes.py",),
        ("ring_ref/difftest/_diagnosis_probes.py", *DIAGNOSIS_TESTS),
    ),
    "difftest.options": (
        ("ring_ref/difftest/_options.py",),
        ("ring_ref/difftest/_options.py", "tests/cover/difftest/test_options.py", *RUN_TESTS),
    ),
    "difftest.rules": (
        ("ring_ref/difftest/_rules.py",),
        (
            "ring_ref/difftest/_rules.py",
            "tests/cover/difftest/test_rules.py",
            *RUN_TESTS,
            *tests_from(
                "tests/cover/test_cli.py", "test_help_and_usage_errors_answer_without_importing_torch"
            ),
        ),
    ),
    # The launchers: their tests that fork workers from pytest's process (milliseconds each).  The call,
    # diagnosis and search modules: their tests with outcomes built by hand and targets run in pytest's
    # process.
    **{
        f"difftest.{name}": ((path,), (path, f"tests/cover/difftest/test_{name}.py"))
        for name in ("worker", "loading", "call")
        for path in (f"ring_ref/difftest/_{name}.py",)
    },
    "difftest.launch": (
        ("ring_ref/difftest/_launch.py",),
        (
            "ring_ref/difftest/_launch.py",
            *tests_from(
                "tests/cover/difftest/test_launch.py",
                "test_the_output_log_counts_bytes_and_keeps_the_start_and_the_end",
            ),
        ),
    ),
    "difftest.diagnosis": (
        ("ring_ref/difftest/_diagnosis.py",),
        # and the collectives' findings (wrong-shard, gather-misplaced, gather-changed-bits)
        ("ring_ref/difftest/_diagnosis.py", *DIAGNOSIS_TESTS, "tests/cover/difftest/test_collectives.py"),
    ),
    "difftest.search": (("ring_ref/difftest/_search.py",), ("ring_ref/difftest/_search.py", *SEARCH_TESTS)),
    "difftest.run": (("ring_ref/difftest/_run.py",), ("ring_ref/difftest/_run.py", *RUN_TESTS)),
    # The process-group launchers: fake communicators in pytest's process, and real gloo groups and MPI
    # jobs (seconds per mutant).
    "difftest.ranks": (
        ("ring_ref/difftest/_ranks.py",),
        (
            "ring_ref/difftest/_ranks.py",
            *RANKS_TESTS,
            # a group whose hub cannot be made: its start fails before any worker is forked
            "tests/cover/difftest/test_jax_framework.py::test_ranks_jax_refuses_to_fork_a_process_that_imported_jax",
            # the JAX and MLX hubs and what their ranks run to join, with stand-ins for both libraries
            "tests/cover/difftest/test_ranks.py",
        ),
    ),
    "difftest.mpi": (
        ("ring_ref/difftest/_mpi.py",),
        (
            "ring_ref/difftest/_mpi.py",
            *tests_from(
                "tests/nocover/test_difftest_mpi.py",
                "test_each_rank_works_on_a_writeable_copy_of_its_own_input_in_place",
            ),
        ),
    ),
    # Which MPI launcher starts --ranks mpi's jobs, and its flags.
    "processes.launchers": (
        ("ring_ref/_processes/_launchers.py",),
        ("ring_ref/_processes/_launchers.py", "tests/cover/test_launchers.py"),
    ),
    # What every launcher shares: die-with-parent, the stacks of hung ranks and the kill (forked workers),
    # the loopback store (gloo groups), the lifecycle base (spawned and forked groups).
    "processes.shared": (
        ("ring_ref/_processes/_shared.py",),
        (
            "ring_ref/_processes/_shared.py",
            "tests/cover/test_processes_shared.py",
            "tests/cover/difftest/test_worker.py",
            *RANKS_TESTS,
            "tests/nocover/test_procs.py",
        ),
    ),
    # A job's rank and size from torchrun's, srun's and the MPIs' variables: environments built by hand.
    "processes.job": (
        ("ring_ref/_processes/_job.py",),
        ("ring_ref/_processes/_job.py", "tests/cover/test_job_env.py"),
    ),
    # The JAX adapter: both engines on jax arrays in pytest's process (jax on the CPU).
    "jax_adapter": (
        ("ring_ref/_jax_adapter.py",),
        ("ring_ref/_jax_adapter.py", "tests/cover/test_jax_adapter.py"),
    ),
    # FPRev's count probes: hand-built trees and the call bounds at moderate N (the file's N = 1024 cases
    # take minutes each).
    "reveal.count": (
        ("ring_ref/_reveal/_count.py",),
        (
            "ring_ref/_reveal/_count.py",
            *(
                f"tests/cover/test_reveal_scale.py::{name}"
                for name in (
                    "test_count_probes_reveal_hand_built_trees",
                    "test_a_multiway_node_is_one_node",
                    "test_a_fold_of_any_ring_costs_at_most_n_plus_two_calls",
                    "test_balanced_and_hierarchical_trees_cost_at_most_n_log_n",
                    "test_any_tree_costs_at_most_n_n_minus_1_over_2",
                    "test_count_probes_in_every_dtype",
                    "test_a_target_that_does_not_count_is_named",
                    "test_count_values_are_a_unit_and_b_2_to_the_p_plus_log_n_plus_1",
                    "test_count_values_in_float16_switch_to_the_smallest_normal_past_its_largest_exponent",
                    "test_hints_choose_the_first_pivot_and_no_pair_is_asked_twice",
                    "test_one_or_two_workers_need_no_call",
                    "test_terms_of_two_leaves_at_one_node_are_searched_as_a_forest",
                    "test_terms_of_equal_leaves_are_ordered_by_their_smallest_leaf",
                    "test_a_forest_spliced_beside_the_pivots_chain_is_put_in_canonical_order",
                    "test_elements_that_part_during_a_sweep_each_get_their_tree",
                    "test_a_subtree_that_is_a_fold_stays_a_fold",
                    "test_answers_that_fit_no_tree_are_named",
                    "test_an_answer_in_a_sweep_that_is_not_a_count_is_named",
                )
            ),
        ),
    ),
    # The hints difftest and reveal share: outcomes and signatures built by hand, targets in pytest's process.
    "hints": (("ring_ref/_hints.py",), ("ring_ref/_hints.py", "tests/cover/test_hints.py")),
    # The invariance tool (placements, runs over sizes and offsets, the report): stacked targets in-process.
    "order_stability": (
        (
            "ring_ref/_order_stability/_placement.py",
            "ring_ref/_order_stability/_run.py",
            "ring_ref/_order_stability/_report.py",
        ),
        (
            "ring_ref/_order_stability/_placement.py",
            "ring_ref/_order_stability/_run.py",
            "ring_ref/_order_stability/_report.py",
            "tests/cover/test_invariance.py",
        ),
    ),
    # Joining MLX's ring from the environment: a stand-in for mlx.core in pytest's process.
    "processes.mlx": (
        ("ring_ref/_processes/_mlx.py",),
        ("ring_ref/_processes/_mlx.py", "tests/cover/test_mlx_env.py"),
    ),
}


class Forked(NamedTuple):
    """Functions that run only in processes the tests fork (mutmut's mangled names), and their tests.

    mutmut learns which tests reach a function in pytest's own process and
    loses what a forked child runs, so ``functions`` (run only in the worker)
    are given the tests of ``forker`` (which forks it), and both the tests in
    ``testers`` (which fork a tester of their own, which forks the worker).
    """

    forker: str
    functions: tuple[str, ...]
    testers: tuple[str, ...]


FORKED: Final[dict[str, Forked]] = {
    "difftest.worker": Forked(
        "ring_ref.difftest._worker.xǁWorkerǁspawn",
        tuple(
            f"ring_ref.difftest._worker.x_{f}"
            for f in ("_frame", "_close_all_but", "_forget_inherited_helpers", "_child")
        ),
        tuple(
            f"tests/cover/difftest/test_worker.py::{test}"
            for test in (
                "test_the_worker_dies_with_the_tester",
                "test_a_target_can_start_multiprocessing_helpers_of_its_own",
                "test_the_worker_holds_no_descriptor_of_the_testers_at_three",
                "test_a_worker_whose_parent_is_already_gone_leaves_at_once_with_status_0",
            )
        ),
    ),
    # die_with_parent runs in the worker the difftest worker's tests fork.
    "processes.shared": Forked(
        "ring_ref.difftest._worker.xǁWorkerǁspawn",
        ("ring_ref._processes._shared.x_die_with_parent",),
        (
            "tests/cover/difftest/test_worker.py::test_a_worker_whose_parent_is_already_gone_leaves_at_once_with_status_0",
            # and in the children these tests fork themselves
            "tests/cover/test_processes_shared.py::test_a_child_asks_for_a_signal_when_its_parent_dies_and_stays_while_its_parent_lives",
            "tests/cover/test_processes_shared.py::test_a_child_whose_parent_is_not_the_one_named_leaves_at_once_with_status_0",
        ),
    ),
    # The backend's groups live in the ranks only (torch calls _create there).
    "ranks.backend": Forked(
        "ring_ref._ranks._backend.x__create",
        (
            *(
                f"ring_ref._ranks._backend.x_{f}"
                for f in ("_order_text", "_done", "_flat_into", "_inner_gloo")
            ),
            *(
                f"ring_ref._ranks._backend.xǁRingRefProcessGroupǁ{method}"
                for method in (
                    "__init__",
                    "getBackendName",
                    "setGroupName",
                    "getGroupName",
                    "setGroupDesc",
                    "getGroupDesc",
                    "shutdown",
                    "__repr__",
                    "_all_reduce",
                    "_same_length",
                    "allreduce",
                    "allreduce_coalesced",
                    "reduce",
                    "_reduce_scatter",
                    "reduce_scatter_single",
                    "reduce_scatter_single_coalesced",
                    "reduce_scatter",
                    "broadcast",
                    "allgather",
                    "allgather_coalesced",
                    "all_gather_single",
                    "all_gather_single_coalesced",
                    "gather",
                    "scatter",
                    "all_to_all_single",
                    "alltoall",
                    "barrier",
                    "send",
                    "recv",
                    "recv_anysource",
                )
            ),
        ),
        BACKEND_TESTS,
    ),
    # Inside an MPI job the run is the ranks' (mpirun starts them); in pytest's process it is reached too,
    # so its own tests stay, and the job's test is added.
    "difftest.run": Forked(
        "ring_ref.difftest._run.x_run_difftest",
        (),
        (
            "tests/nocover/test_difftest_job.py::test_an_mpi_job_of_one_rank_ends_a_call_at_the_time_limit_asked",
        ),
    ),
    # The at-fork handler runs only in a child the test forks itself.
    "kernel": Forked(
        "ring_ref._fast._kernel.x__after_fork_in_child",
        (),
        ("tests/cover/test_kernel.py::test_a_forked_child_is_not_stopped_by_locks_held_in_the_parent",),
    ),
}
"""Per module, see :class:`Forked`."""


DO_NOT_MUTATE: Final = (r"^\s*self\.pid = 0$",)
"""Lines (regular expressions) left unmutated because a mutant of theirs signals processes outside the
run: with ``self.pid = 1`` a worker's ``kill`` sends SIGKILL to process 1 and its process group (the
machine's init and its services)."""

KILLED: Final = frozenset({"killed", "timeout", "caught by type check", "segfault", "suspicious"})
"""mutmut's statuses of a mutant the tests caught (``segfault``: the test run died by SIGSEGV or SIGKILL;
``suspicious``: any other status a passing run never has, such as SIGABRT when LLVM stops on an assertion
that a mutant of the kernel's compiler calls trips)."""


class Equivalent(NamedTuple):
    """A row of ``tests/mutation/equivalent.md``."""

    function: str
    line: str
    reason: str


_CELL: Final = re.compile(r"(?<!\\)\|")


def read_equivalents(path: Path = EQUIVALENT) -> list[Equivalent]:
    """The table rows ``| module.function | `mutated line` | reason |`` (header rows skipped).

    A ``|`` inside a cell is written ``\\|``, as Markdown tables need.
    """
    rows = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        inner = raw.strip().removeprefix("|").removesuffix("|")
        cells = [c.strip().replace("\\|", "|") for c in _CELL.split(inner)] if raw.startswith("|") else []
        if len(cells) == 3 and cells[0].strip("`").startswith("ring_ref."):
            rows.append(Equivalent(cells[0].strip("`"), cells[1].strip("`"), cells[2]))
    return rows


class Mutant(NamedTuple):
    """One mutant and its fate: ``line`` is its first changed line, ``was`` that line before."""

    name: str
    status: str
    function: str
    line: str
    was: str = ""


_NAME: Final = re.compile(r"^(?P<module>[\w.]+)\.(?P<func>[^.]+)__mutmut_(?P<k>\d+)$")


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    out: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out[node.name] = node
    return out


_DEF_NAME: Final = re.compile(r"[^\s(]+__mutmut_(?:orig|\d+)")


@lru_cache(maxsize=8)
def _parsed(source: str) -> dict[str, list[str]]:
    """Each function's lines, by name (parsed once per mutated file: it holds every mutant)."""
    lines = source.splitlines()
    return {
        name: lines[node.lineno - 1 : node.end_lineno] for name, node in _functions(ast.parse(source)).items()
    }


def mutated_line(source: str, func: str, k: str) -> str:
    """The first line of mutant ``k`` of ``func`` that differs from the original, stripped."""
    return changed_lines(source, func, k)[1]


def changed_lines(source: str, func: str, k: str) -> tuple[str, str]:
    """The first differing line of the original and of mutant ``k`` of ``func``, stripped.

    A line the mutant lacks (or has only closing brackets for) reads ``"(deleted) <that line>"``;
    ``"?"`` stands for a mutant not found.
    """
    defs = _parsed(source)
    leaf = func.rsplit("ǁ", maxsplit=1)[-1]  # a method's mangled name is xǁClassǁmethod
    orig = defs.get(f"{func}__mutmut_orig") or defs.get(f"{leaf}__mutmut_orig")
    mutant = defs.get(f"{func}__mutmut_{k}") or defs.get(f"{leaf}__mutmut_{k}")
    if orig is None or mutant is None:
        return "?", "?"
    # The whole definition, signature included (a mutated default), both under the function's own name.
    name = leaf.removeprefix("x_")
    a = [_DEF_NAME.sub(name, orig[0], count=1), *orig[1:]]
    b = [_DEF_NAME.sub(name, mutant[0], count=1), *mutant[1:]]
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag != "equal":
            was = a[i1].strip() if i1 < i2 else "(no line)"
            now = b[j1].strip() if j1 < j2 else ""
            return was, now if any(ch.isalnum() for ch in now) else f"(deleted) {was}"
    return "?", "?"


def _public_function(module: str, func: str) -> str:
    name = func.split("ǁ")
    pieces = [piece[2:] if piece.startswith("x_") else piece for piece in name if piece not in {"x", ""}]
    return f"{module}.{'.'.join(pieces)}"


@dataclass
class ModuleScore:
    """One module's run."""

    name: str
    seconds: float
    mutants: list[Mutant] = field(default_factory=list)
    equivalent: list[Mutant] = field(default_factory=list)

    @property
    def killed(self) -> list[Mutant]:
        return [m for m in self.mutants if m.status in KILLED]

    @property
    def surviving(self) -> list[Mutant]:
        eq = {m.name for m in self.equivalent}
        return [m for m in self.mutants if m not in self.killed and m.name not in eq]

    @property
    def score(self) -> float:
        considered = len(self.mutants) - len(self.equivalent)
        return len(self.killed) / considered if considered else 1.0


def _copy_tree(dest: Path) -> None:
    """The committed tree (``HEAD``): reproducible, and untouched by edits in progress elsewhere."""
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


_PLUGIN: Final = "ring_ref_mutation_plugin"
_PLUGIN_SOURCE: Final = '''"""Loaded into mutmut's pytest runs (PYTEST_PLUGINS) by tools/mutation.py."""

import contextlib
import ctypes
import os


def pytest_configure(config):
    """A process group of its own for each run (mutmut forks one per mutant).

    A mutant can signal its own process group (os.killpg(0, ...) once a
    worker's pid guard is gone): that must end its own run, not mutmut.
    """
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)


def pytest_unconfigure(config):
    """Stop being a child subreaper (the session fixture of tests/conftest.py made this process one).

    mutmut runs the tests in its own process before it forks one process per
    mutant, and reaps those with os.wait(): as a subreaper it would also be
    given, and choke on, the orphans a mutant's killed test run leaves (workers
    of the isolated tester).
    """
    ctypes.CDLL(None).prctl(36, 0)  # PR_SET_CHILD_SUBREAPER
'''
"""A pytest plugin for mutmut's runs (see its docstring)."""


def _toml_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


def _configure(work: Path, files: Sequence[str], tests: Sequence[str]) -> dict[str, str]:
    """Configure mutmut in ``work`` for these files and tests; the environment to run it in."""
    with (work / "pyproject.toml").open("a", encoding="utf-8") as f:
        f.write(
            "\n[tool.mutmut]\n"
            'source_paths = ["ring_ref"]\n'
            f"also_copy = {_toml_list([d for d in EXTRA_DIRS if (work / d).exists()])}\n"
            f"only_mutate = {_toml_list(files)}\n"
            f"pytest_add_cli_args_test_selection = {_toml_list(tests)}\n"
            'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-p", "no:randomly", '
            '"-m", "not soak and not gpu"]\n'
            "use_git_change_detection = false\n"
            "do_not_mutate_patterns = [" + ", ".join(f"'{p}'" for p in DO_NOT_MUTATE) + "]\n"
        )
    plugin = work / ".mutation-plugin"
    plugin.mkdir()
    (plugin / f"{_PLUGIN}.py").write_text(_PLUGIN_SOURCE, encoding="utf-8")
    # mutmut forks every mutant's run from a process that has already run the tests: a thread
    # pool started before the fork (torch's OpenMP pool) deadlocks the child, so one thread.
    return {
        **os.environ,
        "HYPOTHESIS_PROFILE": "default",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(plugin), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "PYTEST_PLUGINS": _PLUGIN,
    }


def _give_forked_their_tests(work: Path, name: str, listing: str) -> list[str]:
    """Record the tests of :data:`FORKED`'s functions in mutmut's statistics; their mutants not yet killed."""
    forked = FORKED[name]
    stats_path = work / "mutants" / "mutmut-stats.json"
    stats = json.loads(stats_path.read_text(encoding="utf-8"))
    tests_of = stats["tests_by_mangled_function_name"]
    extra = set(tests_of.get(forked.forker, ())) | set(forked.testers)
    for key in (forked.forker, *forked.functions):
        tests_of[key] = sorted(set(tests_of.get(key, ())) | extra)
    stats_path.write_text(json.dumps(stats), encoding="utf-8")
    return [
        mutant
        for mutant, _, status in (raw.strip().rpartition(": ") for raw in listing.splitlines())
        if status in {"no tests", "survived"}
        and mutant.rpartition("__mutmut_")[0] in {forked.forker, *forked.functions}
    ]


def selection(sample: str = "", functions: Sequence[str] = ()) -> list[str]:
    """mutmut's name patterns for a partial run; none for a complete one.

    ``sample`` (digits) keeps the mutants whose number ends in one of them;
    ``functions`` keeps those of the functions or methods of these names.

    >>> selection()
    []
    >>> selection("05")
    ['*__mutmut_*[05]']
    >>> selection("", ["_replay"])
    ['*x__replay__mutmut_*', '*ǁ_replay__mutmut_*']
    """
    tail = f"[{sample}]" if sample else ""
    if not functions:
        return [f"*__mutmut_*{tail}"] if sample else []
    # mutmut mangles a function f as x_f and a method C.f as xǁCǁf.
    return [f"*{mark}{f}__mutmut_*{tail}" for f in functions for mark in ("x_", "ǁ")]


def run_module(
    name: str,
    equivalents: Sequence[Equivalent],
    sample: str = "",
    max_children: int = MAX_CHILDREN,
    functions: Sequence[str] = (),
) -> ModuleScore:
    """Run mutmut on one module in a scratch copy of the tree.

    ``sample`` (digits, e.g. ``"05"``) runs only the mutants whose number ends in
    one of them, a fixed sample for modules too slow to run whole; ``functions``
    only those of the functions named (a change's new lines).  The functions
    of :data:`FORKED` are run in a second pass, once mutmut knows their tests.
    """
    patterns = selection(sample, functions)
    files, tests = MODULES[name]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"ring-ref-mutation-{name}-") as tmp:
        work = Path(tmp)
        _copy_tree(work)
        env = _configure(work, files, tuple(t for t in tests if (work / t.partition("::")[0]).exists()))
        mutmut = [str(Path(sys.executable).parent / "mutmut")]

        def mutmut_run(*names: str) -> None:
            run = subprocess.run(
                [*mutmut, "run", "--max-children", str(max_children), *names],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if run.returncode != 0:
                raise RuntimeError(
                    f"mutmut run failed for {name}:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
                )

        def results() -> str:
            return subprocess.run(
                [*mutmut, "results", "--all", "true"],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout

        mutmut_run(*patterns)
        listing = results()
        untested = _give_forked_their_tests(work, name, listing) if name in FORKED else []
        if untested:
            mutmut_run(*untested)
            listing = results()
        score = ModuleScore(name, 0.0)
        sources: dict[str, str] = {}
        for raw in listing.splitlines():
            mutant_name, _, status = raw.strip().rpartition(": ")
            match = _NAME.match(mutant_name)
            if not match or (patterns and status == "not checked"):
                continue
            module = match["module"]
            if module not in sources:
                path = work / "mutants" / (module.replace(".", "/") + ".py")
                if not path.exists():
                    path = work / "mutants" / module.replace(".", "/") / "__init__.py"
                sources[module] = path.read_text(encoding="utf-8")
            was, line = changed_lines(sources[module], match["func"], match["k"])
            function = _public_function(module, match["func"])
            mutant = Mutant(mutant_name, status, function, line, was)
            score.mutants.append(mutant)
            alive = status not in KILLED
            if alive and any(e.function == function and e.line == line for e in equivalents):
                score.equivalent.append(mutant)
    score.seconds = time.perf_counter() - started
    return score


def stale_equivalents(name: str, score: ModuleScore, equivalents: Sequence[Equivalent]) -> list[Equivalent]:
    """Rows for the module's files that matched no surviving mutant of a complete run: to prune."""
    files = MODULES[name][0]
    modules = tuple(f.removesuffix(".py").replace("/", ".") + "." for f in files)
    used = {(m.function, m.line) for m in score.equivalent}
    return [e for e in equivalents if e.function.startswith(modules) and (e.function, e.line) not in used]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen modules; print scores and survivors; exit 1 below the target."""
    parser = argparse.ArgumentParser(description="mutation testing with mutmut, per module")
    parser.add_argument("modules", nargs="*", help=f"some of {', '.join(MODULES)} (default: all)")
    parser.add_argument(
        "--sample",
        default="",
        metavar="DIGITS",
        help="run only the mutants whose number ends in one of DIGITS (e.g. 05: a fifth of them)",
    )
    parser.add_argument(
        "--function",
        action="append",
        default=[],
        metavar="NAME",
        help="run only the mutants of this function or method (repeatable), e.g. after a small fix",
    )
    parser.add_argument(
        "--max-children",
        type=int,
        default=MAX_CHILDREN,
        metavar="N",
        help=f"mutants tested at once (default {MAX_CHILDREN}; 1 on a machine shared with others)",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.modules) - set(MODULES))
    if unknown:
        parser.error(f"unknown modules {unknown}; choose from {', '.join(MODULES)}")
    equivalents = read_equivalents()
    scores = []
    for name in args.modules or list(MODULES):
        score = run_module(name, equivalents, args.sample, args.max_children, args.function)
        scores.append(score)
        print(
            f"{name:10} {len(score.killed):4} killed / {len(score.mutants) - len(score.equivalent):4} "
            f"non-equivalent ({len(score.equivalent)} equivalent) = {100 * score.score:5.1f} %"
            f"  in {score.seconds:6.1f} s"
            + (f" (sample: mutants numbered *[{args.sample}])" * bool(args.sample))
            + (f" (only {', '.join(args.function)})" * bool(args.function)),
            flush=True,
        )
        for m in score.surviving:
            print(f"    {m.status:9} {m.name}: {m.line}    (was: {m.was})", flush=True)
        if not (args.sample or args.function):
            for row in stale_equivalents(name, score, equivalents):
                print(f"    stale row (no surviving mutant has it): {row.function}: {row.line}")
    below = [s.name for s in scores if s.score < TARGET]
    print(f"target {100 * TARGET:.0f} % per module: " + (f"MISSED by {below}" if below else "met"))
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main())
