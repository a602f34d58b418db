"""The hints difftest and reveal give from evidence (clause ``difftest-hints``): a signature that does not
fit the launcher's call is a usage error before any call, a wrong-kind or wrong-collective result names
the fix, and reveal says the same as difftest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ring_ref._cli import main
from ring_ref._reveal import RevealError, reveal
from ring_ref.difftest import Case, TargetError, difftest
from ring_ref.difftest._call import Answer, Outcome, TensorView
from ring_ref.difftest._orders import per_rank_target
from ring_ref.difftest._verdict import structural
from tests.common import planted_hints

pytestmark = pytest.mark.clause("difftest-hints")

HINTS = planted_hints.FILE


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["difftest", f"{HINTS}:two_arguments"], "--ranks mpi"),
        (["difftest", "--ranks", "gloo", f"{HINTS}:two_arguments"], "--collective reduce-scatter"),
        (
            ["difftest", "--ranks", "gloo", "--collective", "reduce-scatter", f"{HINTS}:stacked_sum"],
            "(output, input)",
        ),
        (["difftest", "--ranks", "mpi", f"{HINTS}:stacked_sum"], "TARGET(comm, array)"),
        (["reveal", f"{HINTS}:two_arguments", "-n", "2", "-m", "2"], "--ranks mpi"),
        (["reveal", "--ranks", "gloo", f"{HINTS}:two_arguments", "-n", "2", "-m", "2"], "--ranks mpi"),
    ],
    ids=["stacked", "gloo", "gloo-collective", "mpi", "reveal", "reveal-gloo"],
)
@pytest.mark.clause("reveal-hints")
def test_a_signature_that_does_not_fit_the_call_is_a_usage_error_before_any_call(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2, not 1 (no bug was found): no launcher is started (a gloo group or an MPI job would take
    seconds; the refusal takes none), and the message names the calls the signature fits."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "positional argument" in err and words in err, err
    assert "looks like a per-rank target: add --ranks gloo" not in err


def test_the_api_refuses_the_same_signature_and_a_fitting_one_runs() -> None:
    with pytest.raises(TargetError, match=r"TARGET\(a, b\) needs 2 positional arguments"):
        difftest(planted_hints.two_arguments, modes="bound", examples=1, seed=1, isolate=False)
    # a decorator may change the signature: the source's is not trusted, the call decides
    report = difftest(f"{HINTS}:decorated_two", modes="bound", examples=1, seed=1)
    assert report.modes["bound"].finding is not None
    assert report.modes["bound"].finding.codes == ["raised"]
    assert difftest(planted_hints.stacked_sum, modes="bound", examples=3, seed=1).verdict == "pass"


def _answer(shape: tuple[int, ...], rank: int | None) -> Answer:
    view = TensorView(shape, (1,) * len(shape), "torch.float32", "cpu", None, None)
    return Answer("Tensor", result=view, rank=rank)


def test_a_stacked_target_s_rank_result_says_drop_ranks() -> None:
    """``x.sum(0)`` on a rank's ``(M,)`` tensor returns a 0-d tensor: a stacked target under --ranks."""
    case = Case(2, 2, (), torch.float32, "contiguous", (1.0, 2.0, 3.0, 4.0))
    found = dict(structural(Outcome(case, (_answer((), 0), _answer((), 1)))))
    assert found["wrong-shape"].startswith("rank(s) [0, 1]: result shape (), expected (2,); ")
    assert (
        "this looks like a stacked target" in found["wrong-shape"] and "drop --ranks" in found["wrong-shape"]
    )
    other = dict(structural(Outcome(case, (_answer((3,), 0), _answer((3,), 1)))))
    assert "drop --ranks" not in other["wrong-shape"]


@pytest.mark.parametrize(("n", "m"), [(2, 4), (3, 3), (1, 2)])
def test_a_reduce_scatter_without_collective_is_told_to_add_it(n: int, m: int) -> None:
    values = tuple(float(v) for v in range(n * m))
    case = Case(n, m, (), torch.float32, "contiguous", values)
    found = dict(structural(Outcome(case, (_answer((n, m // n), None),))))
    assert "add --collective reduce-scatter" in found["wrong-shape"]


def test_difftest_of_a_stacked_reduce_scatter_without_collective_names_the_option() -> None:
    report = difftest(planted_hints.stacked_reduce_scatter, modes="bound", examples=5, seed=1, isolate=False)
    finding = report.modes["bound"].finding
    assert finding is not None and finding.codes == ["wrong-shape"]
    assert "add --collective reduce-scatter" in finding.explanation


@pytest.mark.clause("reveal-hints")
def test_reveal_of_a_per_rank_target_called_stacked_says_add_ranks_as_difftest_does() -> None:
    with pytest.raises(RevealError) as info:
        reveal(planted_hints.per_rank_all_reduce, 2, 2, "float32")
    report = difftest(planted_hints.per_rank_all_reduce, modes="bound", examples=1, seed=1, isolate=False)
    finding = report.modes["bound"].finding
    assert finding is not None
    hint = "this looks like a per-rank target: add --ranks gloo (ranks='gloo')"
    assert hint in str(info.value) and hint in finding.explanation


class _Answers:
    """A per-rank launcher stand-in that answers every case with the same answers."""

    per_rank = True

    def __init__(self, *answers: Answer) -> None:
        self.answers = answers

    def call(self, case: Case) -> Outcome:
        return Outcome(case, self.answers)


@pytest.mark.clause("reveal-hints")
def test_reveal_over_ranks_of_a_stacked_target_says_drop_ranks_once() -> None:
    call = per_rank_target(_Answers(_answer((), 0), _answer((), 1)))  # type: ignore[arg-type]
    with pytest.raises(RevealError) as info:
        reveal(call, 2, 2, "float32")
    message = str(info.value)
    assert "ranks [0, 1] returned a () torch.float32 tensor" in message, message
    assert message.count("drop --ranks") == 1 and "no such tensor" not in message


def test_an_unreadable_order_file_says_what_it_must_be(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "order.json"
    broken.write_text('{"format":\n', encoding="utf-8")
    status = main(["difftest", f"{HINTS}:stacked_sum", "--order", str(broken), "--examples", "1"])
    err = capsys.readouterr().err
    assert status == 2
    assert "cannot read the order file" in err and "`ring-ref reveal TARGET -n N -m M --json > FILE`" in err
    json.loads(json.dumps(err))  # one line of text, no traceback
    assert "Traceback" not in err
