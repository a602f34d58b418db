"""The hints difftest and reveal give from evidence (clause ``difftest-hints``): a signature that does not
fit the launcher's call is a usage error before any call, a wrong-kind or wrong-collective result names
the fix, and reveal says the same as difftest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ring_ref._cli import main
from ring_ref._hints import Params, call_of, params_of, raised_hint, shape_hint, signature_problem
from ring_ref._reveal import RevealError, reveal
from ring_ref.difftest import Case, TargetError, difftest
from ring_ref.difftest._call import Answer, Outcome, TensorView
from ring_ref.difftest._orders import per_rank_target
from ring_ref.difftest._verdict import structural
from ring_ref.schedule import Collective
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


# --- each hint function on its own: exact answers, written from the rules in the module's docstring ---

FITS_1 = "a stacked TARGET(worker_tensors) (no --ranks), or a per-rank TARGET(tensor) (--ranks gloo)"
FITS_2 = (
    "a per-rank TARGET(comm, array) (--ranks mpi), or a rank's reduce-scatter or all-gather TARGET(output, "
    "input) (--ranks gloo --collective reduce-scatter / all-gather)"
)
FITS_3 = (
    "a rank's reduce-scatter or all-gather TARGET(comm, sendbuf, recvbuf) (--ranks mpi --collective "
    "reduce-scatter / all-gather)"
)
AR, RS, AG = Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER


@pytest.mark.parametrize(
    ("ranks", "collective", "call"),
    [
        (None, RS, ("worker_tensors",)),
        ("gloo", AR, ("tensor",)),
        ("job", AR, ("tensor",)),
        ("mpi", AR, ("comm", "array")),
        ("mpi-job", AR, ("comm", "array")),
        ("gloo", RS, ("output", "input")),
        ("mpi", RS, ("comm", "sendbuf", "recvbuf")),
        ("mpi-job", AG, ("comm", "sendbuf", "recvbuf")),
    ],
)
def test_each_launcher_calls_with_its_own_arguments(
    ranks: str | None, collective: Collective, call: tuple[str, ...]
) -> None:
    assert call_of(ranks, collective) == call


def test_a_callables_positional_parameters_and_star() -> None:
    assert params_of(lambda a: None) == Params(("a",), 1, False)
    assert params_of(lambda a, b=1, *rest, c: None) == Params(("a", "b"), 1, True)
    assert params_of(len) == Params(("obj",), 1, False)
    assert params_of(object()) is None  # no signature


SOURCE = """\
# -*- coding: utf-8 -*-  é
import functools


def star(a, b=1, *rest):
    pass


def plain(a, b):
    pass


async def waits(x, op=None):
    pass


@functools.cache
def decorated(a, b, c):
    pass


class Klass:
    pass


def rebound(a):
    pass


rebound = Klass


def twice(a):
    pass


def twice(a, b, c):
    pass
"""


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("star", Params(("a", "b"), 1, True)),
        ("plain", Params(("a", "b"), 2, False)),
        ("waits", Params(("x", "op"), 1, False)),
        ("decorated", None),
        ("Klass", None),
        ("rebound", None),
        ("twice", Params(("a", "b", "c"), 3, False)),
        ("absent", None),
    ],
)
def test_a_target_strings_parameters_are_read_from_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, params: Params | None
) -> None:
    folder = tmp_path / "a:b"  # a colon in the path: only the last one parts module and function
    folder.mkdir()
    (folder / "planted_mod.py").write_text(SOURCE, encoding="utf-8")
    assert params_of(f"{folder / 'planted_mod.py'}:{name}") == params
    package = tmp_path / "pkg_hint_probe"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "mod.py").write_text(SOURCE, encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # found from the working directory, as `python -m ring_ref` finds it
    assert params_of(f"pkg_hint_probe.mod:{name}") == params


def test_a_module_that_cannot_be_read_gives_no_parameters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "namespace_hint_probe").mkdir()  # no __init__: a namespace package has no source
    monkeypatch.chdir(tmp_path)
    assert params_of("namespace_hint_probe:f") is None
    assert params_of("no_such_module_for_hints:f") is None
    assert params_of(f"{tmp_path / 'missing.py'}:f") is None


@pytest.mark.parametrize(
    ("target", "ranks", "collective", "op", "problem"),
    [
        (lambda x, op: None, None, AR, True, ""),
        (
            lambda x, op: None,
            None,
            AR,
            False,
            "TARGET(x, op) needs 2 positional arguments, but a stacked target is called "
            f"TARGET(worker_tensors): it fits {FITS_2}",
        ),
        (
            lambda a, b: None,
            "gloo",
            AR,
            False,
            "TARGET(a, b) needs 2 positional arguments, but --ranks gloo is called TARGET(tensor): it fits "
            f"{FITS_2}",
        ),
        (
            lambda a, op, c: None,
            "gloo",
            AR,
            True,
            "TARGET(a, op, c) needs 2 positional arguments, but --ranks gloo is called TARGET(tensor): "
            f"it fits {FITS_2}",
        ),
        (
            lambda a, op, c: None,
            "gloo",
            AR,
            False,
            "TARGET(a, op, c) needs 3 positional arguments, but --ranks gloo is called TARGET(tensor): "
            f"it fits {FITS_3}",
        ),
        (
            lambda a, b, c=1: None,
            None,
            AR,
            False,
            "TARGET(a, b) needs 2 positional arguments, but a stacked target is called "
            f"TARGET(worker_tensors): it fits {FITS_2}",
        ),
        (
            lambda a, b=1: None,
            "mpi",
            RS,
            False,
            "TARGET(a) needs 1 positional argument (at most 2), but --ranks mpi --collective reduce-scatter "
            f"is called TARGET(comm, sendbuf, recvbuf): it fits {FITS_2}",
        ),
        (
            lambda a: None,
            "mpi",
            AR,
            False,
            "TARGET(a) needs 1 positional argument (at most 1), but --ranks mpi is called "
            f"TARGET(comm, array): it fits {FITS_1}",
        ),
        (
            lambda a, b, c, d: None,
            None,
            AR,
            False,
            "TARGET(a, b, c, d) needs 4 positional arguments, but a stacked target is called "
            "TARGET(worker_tensors)",
        ),
    ],
    ids=["op-keyword", "op-not-passed", "gloo", "op-in-range", "op-not-in-range", "default-beyond", "fewer",
         "one", "four"],
)  # fmt: skip
def test_a_signature_problem_in_full_words(
    target: object, ranks: str | None, collective: Collective, op: bool, problem: str
) -> None:
    assert signature_problem(target, ranks, collective, op=op) == problem


def test_signature_problem_reads_no_op_keyword_by_default() -> None:
    assert signature_problem(lambda x, op: None, None, AR) != ""


PER_RANK_HINT = (
    "; this looks like a per-rank target: add --ranks gloo (ranks='gloo'), or --ranks mpi (ranks='mpi') for "
    "TARGET(comm, array)"
)
STACKED_HINT = (
    "; this looks like a stacked target (worker_tensors of shape (N, M, ...)): drop --ranks (ranks=None)"
)
MORE_HINT = f"; TARGET needs more arguments than this call passes: two fit {FITS_2}"


@pytest.mark.parametrize(
    ("raised", "per_rank", "hint"),
    [
        ("ValueError: Default process group has not been initialized, please call", False, PER_RANK_HINT),
        ("ValueError: Default process group has not been initialized, please call", True, ""),
        ("TypeError: f() missing 1 required positional argument: 'b'", False, MORE_HINT),
        ("TypeError: f() missing 1 required positional argument: 'b'", True, MORE_HINT),
        ("ValueError: 1 required positional argument", False, ""),
        ("TypeError: unsupported operand type(s) for +", False, ""),
        ("IndexError: tuple index out of range", True, STACKED_HINT),
        ("RuntimeError: The size of tensor a must match: Shape mismatch", True, STACKED_HINT),
        ("IndexError: tuple index out of range", False, ""),
        ("ValueError: something else went wrong", True, ""),
    ],
)
def test_a_raised_hint_in_full_words(raised: str, per_rank: bool, hint: str) -> None:
    assert raised_hint(raised, per_rank=per_rank) == hint


@pytest.mark.parametrize(
    ("got", "want", "n", "per_rank", "collective", "hint"),
    [
        ((2, 3), (6,), 2, False, RS, ""),
        ((3,), (2, 3), 2, True, AR, "; this looks like a stacked target: rank tensors of shape (M, ...) were "
         "reduced over their first axis, as a stacked target sums its workers: drop --ranks (ranks=None)"),
        ((2,), (2, 3), 2, True, AR, ""),
        ((2, 2, 3), (4, 3), 2, False, AR, "; this looks like a reduce-scatter (row r is rank r's shard of "
         "M/N): add --collective reduce-scatter (collective='reduce-scatter')"),
        ((1, 4), (4,), 1, False, AR, " (a stack of N copies? or a reduce-scatter's N shards: then add "
         "--collective reduce-scatter)"),
        ((3, 4, 2), (4, 2), 3, False, AR, " (a stack of N copies?)"),
        ((5,), (4,), 2, False, AR, ""),
        ((), (), 2, False, AR, ""),
    ],
    ids=["alone", "per-rank-reduced", "per-rank-other", "shards", "both", "copies", "neither", "scalar"],
)  # fmt: skip
def test_a_shape_hint_in_full_words(  # noqa: PLR0917  # one row of the table each
    got: tuple[int, ...], want: tuple[int, ...], n: int, per_rank: bool, collective: Collective, hint: str
) -> None:
    assert shape_hint(got, want, n=n, per_rank=per_rank, collective=collective) == hint
