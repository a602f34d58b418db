"""The public surface: which modules are public, what they export, and the engine-level warnings."""

from __future__ import annotations

import importlib
import pkgutil
import re
import warnings

import numpy as np
import pytest
import torch

import ring_ref
from ring_ref import REFERENCE_SLOW_N, SlowReferenceWarning, ring_all_reduce
from tests.common.paths import DOCS, ROOT

PUBLIC = {
    "ring_ref",
    "ring_ref.schedule",
    "ring_ref.core",
    "ring_ref.invariants",
    "ring_ref.testing",
    "ring_ref.distributed",
    "ring_ref.mpi",
    "ring_ref.targets",
    "ring_ref.difftest",
    "ring_ref.invariance",
}

# Every name the public modules exported in release 0.2.0, before the redesign that moved the internals
# (typed in from that release's __all__ lists, not read from the package): each must still be there.
RELEASED: dict[str, tuple[str, ...]] = {
    "ring_ref": (
        "ENGINES",
        "OPS",
        "PRESETS",
        "REFERENCE_SLOW_N",
        "Engine",
        "InvariantViolation",
        "Op",
        "RingSchedule",
        "SlowReferenceWarning",
        "__version__",
        "ring_all_reduce",
    ),
    "ring_ref.schedule": (
        "ALL_GATHER",
        "GLOO",
        "LAYOUTS",
        "OPENMPI_RING",
        "PHASES",
        "PRESETS",
        "REDUCE_SCATTER",
        "SPEC",
        "Layout",
        "Phase",
        "RingSchedule",
        "Send",
        "ag_recv_chunk",
        "ag_send_chunk",
        "all_rounds",
        "elements_sent_per_worker",
        "left",
        "owned_chunk",
        "right",
        "rounds_per_phase",
        "rs_recv_chunk",
        "rs_send_chunk",
        "send_chunk",
        "sends",
    ),
    "ring_ref.core": (
        "Combine",
        "Observer",
        "all_gather_round",
        "exchange",
        "fold",
        "initial_state",
        "provenance_state",
        "reduce_scatter_round",
        "run_ring",
        "step",
    ),
    "ring_ref.invariants": (
        "InvariantViolation",
        "Provenance",
        "State",
        "Violation",
        "ag_expected",
        "arc",
        "changed_slot",
        "check",
        "check_round",
        "expected_finished",
        "expected_state",
        "finished_chunks",
        "first_violation",
        "holds_ag_invariant",
        "holds_finished_chunks",
        "holds_rs_invariant",
        "is_complete",
        "rs_expected",
    ),
    "ring_ref.testing": (
        "Mismatch",
        "RoundCallback",
        "TraceMismatch",
        "TracedImplementation",
        "assert_matches_reference",
        "check_trace",
        "first_mismatch",
    ),
    "ring_ref.difftest": (
        "CODES",
        "DTYPES",
        "MODES",
        "OPS",
        "Case",
        "Finding",
        "Mode",
        "ModeResult",
        "Op",
        "OpTarget",
        "Report",
        "Target",
        "TargetError",
        "difftest",
        "load_target",
    ),
    "ring_ref.distributed": (
        "EXCHANGE_SEGMENT_BYTES",
        "LEAD_BYTES",
        "MAX_SEGMENTS",
        "SEGMENT_BYTES",
        "SWAP_BYTES",
        "RingHookState",
        "ring_all_reduce_",
        "ring_hook",
    ),
    "ring_ref.mpi": (
        "OPENMPI_ALLREDUCE_ALGORITHMS",
        "openmpi_allreduce_mca",
        "ring_allreduce_",
    ),
    "ring_ref.targets": (
        "close",
        "gloo_all_reduce",
        "mpi_allreduce",
    ),
}


def _modules() -> list[str]:
    found = ["ring_ref"]
    for info in pkgutil.walk_packages(ring_ref.__path__, "ring_ref."):
        found.append(info.name)
    return found


def test_public_modules_are_exactly_the_documented_ones_and_declare_all() -> None:
    public = {name for name in _modules() if not any(part.startswith("_") for part in name.split(".")[1:])}
    assert public == PUBLIC
    for name in sorted(public):
        module = importlib.import_module(name)
        exported = getattr(module, "__all__", None)
        assert exported, f"{name} has no __all__"
        missing = [item for item in exported if not hasattr(module, item)]
        assert not missing, f"{name}.__all__ names missing attributes {missing}"


def test_reference_engine_warns_before_a_ring_that_takes_seconds() -> None:
    small = torch.ones(REFERENCE_SLOW_N - 1, REFERENCE_SLOW_N - 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ring_all_reduce(small)
        ring_all_reduce(torch.ones(2 * REFERENCE_SLOW_N, 2 * REFERENCE_SLOW_N), engine="fast")
    big = np.ones((REFERENCE_SLOW_N, REFERENCE_SLOW_N), dtype=np.float32)
    with pytest.warns(SlowReferenceWarning, match="engine='fast'"):
        got = ring_all_reduce(big)
    assert got.tolist() == [float(REFERENCE_SLOW_N)] * REFERENCE_SLOW_N


def test_architecture_module_table_matches_the_tree() -> None:
    """Every module of the package, subpackages' too, is in the architecture page's module table
    (docs/architecture.md), and the table names no missing file."""
    page = (DOCS / "architecture.md").read_text(encoding="utf-8")
    table = page[page.index("\n## Modules\n") :].split("\n## ")[1]
    named = set(re.findall(r"^\| [^|]* \| `(ring_ref/[\w/]+\.py)` \|", table, flags=re.MULTILINE))
    package = ROOT / "ring_ref"
    on_disk = {
        f"ring_ref/{path.relative_to(package).as_posix()}"
        for path in package.rglob("*.py")
        if path.name != "__main__.py"
    }
    assert named == on_disk, (sorted(on_disk - named), sorted(named - on_disk))


def test_architecture_module_table_renders_as_one_table() -> None:
    """The module table is one Markdown table: a table ends at its first line that is not a row, so a
    blank line inside it would leave the rows after it as a paragraph of pipes (as one did at line 96)."""
    page = (DOCS / "architecture.md").read_text(encoding="utf-8")
    lines = page[page.index("\n## Modules\n") :].split("\n## ")[1].splitlines()
    start = lines.index("| layer | module | what |")
    assert lines[start + 1] == "|---|---|---|"
    rows = lines[start + 2 :]
    end = next((i for i, line in enumerate(rows) if not line.startswith("|")), len(rows))
    stray = [line for line in rows[end:] if line.startswith("|")]
    assert not stray, f"{rows[end]!r} ends the table before {stray[0]!r}"
    row = re.compile(r"\| [^|]+ \| `ring_ref/[\w/]+\.py` \| .+ \|")
    malformed = [line for line in rows[:end] if not row.fullmatch(line)]
    assert not malformed, malformed


def test_the_old_mpi_name_warns_and_forwards_every_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    """The name before the rename, ``ring_ref.mpi.ring_allreduce_``, warns and calls ``ring_all_reduce_``."""
    import ring_ref.mpi

    calls: list[tuple[object, object, object, object]] = []

    def recorder(comm: object, array: object, *, timeout: object, schedule: object) -> object:
        calls.append((comm, array, timeout, schedule))
        return array

    monkeypatch.setattr(ring_ref.mpi, "ring_all_reduce_", recorder)
    comm, array = object(), np.zeros(3)
    with pytest.warns(DeprecationWarning, match=r"renamed ring_ref\.mpi\.ring_all_reduce_"):
        got = ring_ref.mpi.ring_allreduce_(comm, array, timeout=2.5, schedule="gloo")  # type: ignore[arg-type]
    assert got is array and calls == [(comm, array, 2.5, "gloo")]


@pytest.mark.parametrize("module", sorted(RELEASED))
def test_every_name_released_before_the_redesign_still_works(module: str) -> None:
    loaded = importlib.import_module(module)
    gone = [name for name in RELEASED[module] if not hasattr(loaded, name)]
    assert not gone, f"{module} no longer has {gone}"
    assert set(RELEASED[module]) <= set(loaded.__all__), f"{module}.__all__ dropped a released name"
