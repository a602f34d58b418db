"""One call of a target (``ring_ref.difftest._call``).

What the worker sends back is plain data (clause ``difftest-isolation``): a
header naming the returned value's type, shape, strides, dtype, device and
storage address range, the exception raised, the same for the argument after
the call, and the raw bits of both.  These tests call :func:`observe` on tiny
targets defined here and check each header field and the payload's bytes
(worked out with :mod:`struct`, not with the module's own helpers); check that
:func:`decode` refuses every malformed field with a :class:`Garbled` naming it
(its words reach the report as ``its reply was garbled (...)``); and check the
judgments made from an answer: the well-formed result, the input left
unchanged (a rank working in place may change it, clause ``difftest-ranks``)
and aliasing, on answers built by hand where the layout matters.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any

import pytest
import torch

from ring_ref.difftest import Case
from ring_ref.difftest._call import (
    Answer,
    Failure,
    Garbled,
    Outcome,
    TensorView,
    aliases,
    call_target,
    decode,
    input_problem,
    observe,
    result_tensor,
    well_formed,
)

pytestmark = pytest.mark.clause("difftest-isolation")

# N = 2 workers of M = 2 rows of 2: worker 0 holds 1 .. 4, worker 1 holds 5 .. 8 (flat).  The
# stacked input is "strided": every other element of a (2, 2, 4) buffer, strides (8, 4, 2), 64 bytes.
VALUES = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0)
STRIDED = Case(2, 2, (2,), torch.float32, "strided", VALUES)
CONTIGUOUS = Case(2, 2, (2,), torch.float32, "contiguous", VALUES)
SUM = (6.0, 8.0, 10.0, 12.0)  # worker 0 + worker 1, elementwise


def f32(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def storage_bytes(view: dict[str, Any]) -> int:
    start, end = view["storage"]
    assert isinstance(start, int) and start > 0
    return int(end - start)


def summed(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0)


def untouched(x: torch.Tensor) -> None:
    return None


# --- observe: the header and the payload -------------------------------------------------------------


def test_a_returned_tensor_is_described_and_its_bits_follow_by_the_arguments() -> None:
    head, payload = observe(summed, STRIDED)
    assert json.loads(json.dumps(head)) == head  # plain JSON
    result, argument = head.pop("result"), head.pop("argument")
    assert head.pop("traceback") == ""
    assert head == {"type": "Tensor", "raised": "", "rank": None, "returned_none": False}
    assert {k: v for k, v in result.items() if k != "storage"} == {
        "shape": [2, 2],
        "stride": [2, 1],
        "dtype": "torch.float32",
        "device": "cpu",
        "bits": 16,
    }
    assert storage_bytes(result) == 16
    assert {k: v for k, v in argument.items() if k != "storage"} == {
        "shape": [2, 2, 2],
        "stride": [8, 4, 2],
        "dtype": "torch.float32",
        "device": "cpu",
        "bits": 32,
    }
    assert storage_bytes(argument) == 64  # the whole (2, 2, 4) buffer the strided view lives in
    assert payload == f32(*SUM) + f32(*VALUES)  # the result's bits, then the argument's, in index order


def test_a_view_of_the_argument_has_the_arguments_storage_range() -> None:
    head, payload = observe(lambda x: x[1], STRIDED)
    assert head["result"]["storage"] == head["argument"]["storage"]
    assert (head["result"]["shape"], head["result"]["stride"]) == ([2, 2], [4, 2])
    assert payload == f32(5.0, 6.0, 7.0, 8.0) + f32(*VALUES)
    answer = decode(head, payload)
    assert aliases(answer)
    assert input_problem(answer, STRIDED) == ""  # it aliases, but did not change the input


@pytest.mark.parametrize(
    ("dtype", "encode"),
    [
        (torch.float16, lambda vs: struct.pack(f"<{len(vs)}e", *vs)),
        (torch.bfloat16, lambda vs: b"".join(struct.pack("<f", v)[2:] for v in vs)),
        (torch.float64, lambda vs: struct.pack(f"<{len(vs)}d", *vs)),
    ],
    ids=["float16", "bfloat16", "float64"],
)
def test_the_bits_are_sent_in_every_tester_dtype(dtype: torch.dtype, encode: Callable[..., bytes]) -> None:
    case = Case(2, 2, (2,), dtype, "sliced", VALUES)
    head, payload = observe(summed, case)
    width = len(encode([1.0]))
    assert (head["result"]["dtype"], head["result"]["bits"]) == (str(dtype), 4 * width)
    assert head["argument"]["bits"] == 8 * width
    assert payload == encode(SUM) + encode(VALUES)
    answer = decode(head, payload)
    assert answer.result is not None and answer.result.values is not None
    assert answer.result.values.dtype == dtype and answer.result.values.tolist() == [[6.0, 8.0], [10.0, 12.0]]


def test_bits_are_sent_only_for_a_cpu_tensor_of_a_tester_dtype_with_the_results_size() -> None:
    for fn, dtype, device in [
        (lambda x: x, "torch.float32", "cpu"),  # N * M elements: not a result's size
        (lambda x: x.sum(0).to(torch.int32), "torch.int32", "cpu"),
        (lambda x: torch.zeros(2, 2, device="meta"), "torch.float32", "meta"),
    ]:
        head, payload = observe(fn, STRIDED)
        assert (head["result"]["dtype"], head["result"]["device"], head["result"]["bits"]) == (
            dtype,
            device,
            0,
        )
        assert (head["result"]["storage"] is None) == (device == "meta")
        assert payload == f32(*VALUES)  # the argument's bits only
        answer = decode(head, payload)
        assert answer.result is not None and answer.result.values is None
        assert result_tensor(answer, STRIDED) is None
    head, _ = observe(
        lambda x: torch.zeros(2, 2, 3, dtype=torch.float64),
        Case(1, 2, (2, 3), torch.float32, "sliced", (0.0,) * 12),
    )
    assert head["result"]["bits"] == 2 * 2 * 3 * 8  # the result's size is M times every trailing size


def test_the_call_is_fn_x_without_an_op_and_fn_x_op_with_one() -> None:
    seen: list[tuple[tuple[int, ...], tuple[int, ...], dict[str, object]]] = []

    def records(x: torch.Tensor, **kwargs: object) -> None:
        seen.append((tuple(x.shape), x.stride(), kwargs))

    observe(records, STRIDED)
    observe(records, CONTIGUOUS, 1)
    max_case = Case(2, 2, (2,), torch.float32, "strided", VALUES, op="max")
    observe(records, max_case)
    observe(records, max_case, 0)
    assert seen[0] == ((2, 2, 2), (8, 4, 2), {})  # the stacked input, in the case's layout
    assert seen[1] == ((2, 2), (2, 1), {})  # one rank's contiguous (M, ...) tensor
    assert seen[2] == ((2, 2, 2), (8, 4, 2), {"op": "max"})  # a stacked target gets the op's name
    assert seen[3] == ((2, 2), (2, 1), {"op": torch.distributed.ReduceOp.MAX})  # a gloo rank, the ReduceOp


def test_a_rank_gets_its_own_values_and_the_argument_is_one_ranks_worth() -> None:
    head, payload = observe(lambda t: t * 2, CONTIGUOUS, 1)
    assert (head["rank"], head["type"], head["returned_none"]) == (1, "Tensor", False)
    assert head["argument"]["shape"] == [2, 2] and head["argument"]["bits"] == 16
    assert payload == f32(10.0, 12.0, 14.0, 16.0) + f32(5.0, 6.0, 7.0, 8.0)


def test_a_rank_returning_none_has_its_argument_after_the_call_as_result() -> None:
    def doubles(t: torch.Tensor) -> None:
        t.mul_(2)

    head, payload = observe(doubles, CONTIGUOUS, 0)
    assert (head["type"], head["returned_none"], head["rank"]) == ("NoneType", True, 0)
    assert head["result"] == head["argument"]
    assert payload == 2 * f32(2.0, 4.0, 6.0, 8.0)
    answer = decode(head, payload)
    assert answer.returned_none and answer.rank == 0
    assert input_problem(answer, CONTIGUOUS) == ""  # in place: the change is its result
    assert not aliases(answer)
    values = well_formed(Outcome(CONTIGUOUS, (answer,)), 0)
    assert values is not None and values.tolist() == [[2.0, 4.0], [6.0, 8.0]]


@pytest.mark.parametrize(
    ("fn", "type_name", "rank"),
    [
        (untouched, "NoneType", None),  # (a rank's None is its argument, above)
        (lambda x: 3, "int", None),
        (lambda x: [x], "list", None),
        (lambda x: 3, "int", 1),
        (lambda x: [x], "list", 1),
    ],
    ids=["none-stacked", "int-stacked", "list-stacked", "int-rank", "list-rank"],
)
def test_a_value_that_is_not_a_tensor_has_only_its_type_name(
    fn: Any, type_name: str, rank: int | None
) -> None:
    case = STRIDED if rank is None else CONTIGUOUS
    head, payload = observe(fn, case, rank)
    assert (head["type"], head["raised"], head["returned_none"], head["rank"]) == (type_name, "", False, rank)
    assert "result" not in head and "argument" in head
    answer = decode(head, payload)
    assert answer.type_name == type_name and answer.result is None
    assert result_tensor(answer, case) is None


def test_a_tensor_subclass_is_named_by_its_type() -> None:
    head, _ = observe(lambda x: torch.nn.Parameter(x.sum(0)), STRIDED)
    assert head["type"] == "Parameter" and head["result"]["bits"] == 16


def _raiser(exc: BaseException) -> Callable[[torch.Tensor], torch.Tensor]:
    def raises_it(x: torch.Tensor) -> torch.Tensor:
        x.zero_()
        raise exc

    return raises_it


def _observe_raising(exc: BaseException, rank: int | None = None) -> tuple[dict[str, Any], bytes]:
    """``observe`` with its default ``catch_interrupt``; an interrupt escaping it fails the test (only)."""
    try:
        return observe(_raiser(exc), STRIDED if rank is None else CONTIGUOUS, rank)
    except KeyboardInterrupt:
        pytest.fail("observe let the target's KeyboardInterrupt through")


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no words")


@pytest.mark.parametrize(
    ("exc", "raised"),
    [
        (ValueError("boom"), "ValueError: boom"),
        (ValueError(), "ValueError"),
        (SystemExit(3), "SystemExit: 3"),
        (KeyboardInterrupt("stop"), "KeyboardInterrupt: stop"),
        (Unprintable(), "Unprintable: <str() failed: RuntimeError>"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_every_exception_is_recorded_with_its_traceback(exc: BaseException, raised: str) -> None:
    head, payload = _observe_raising(exc)
    assert (head["raised"], head["type"], head["returned_none"]) == (raised, "NoneType", False)
    assert head["traceback"].startswith('Traceback (most recent call last):\n  File "')
    assert "in raises_it" in head["traceback"] and head["traceback"].endswith("\n")
    assert type(exc).__name__ in head["traceback"].splitlines()[-1]
    assert "result" not in head
    assert payload == f32(*[0.0] * 8)  # the argument, after the call zeroed it
    answer = decode(head, payload)
    assert answer.raised == raised and answer.traceback == head["traceback"]
    assert input_problem(answer, STRIDED) == "the input was modified: element (0, 0, 0) was 1.0, is now 0.0"


def test_an_interrupt_stops_the_tester_when_asked_and_system_exit_never_does() -> None:
    with pytest.raises(KeyboardInterrupt, match="stop"):
        observe(_raiser(KeyboardInterrupt("stop")), STRIDED, catch_interrupt=False)
    head, _ = observe(_raiser(SystemExit(0)), STRIDED, catch_interrupt=False)
    assert head["raised"] == "SystemExit: 0"
    head, _ = _observe_raising(KeyboardInterrupt(), 0)
    assert head["raised"] == "KeyboardInterrupt"
    with pytest.raises(KeyboardInterrupt):
        call_target(_raiser(KeyboardInterrupt()), STRIDED)


def test_an_unreadable_result_or_argument_is_said_so_and_sends_no_bits() -> None:
    sparse = torch.zeros(2, 2).to_sparse()
    with pytest.raises(Exception) as got:  # what torch says when asked for a sparse tensor's storage
        sparse.untyped_storage()
    head, payload = observe(lambda x: x.sum(0).to_sparse(), STRIDED)
    assert head["type"] == f"Tensor (unreadable: {type(got.value).__name__}: {got.value})"
    assert "result" not in head and payload == f32(*VALUES)

    def negated(t: torch.Tensor) -> torch.Tensor:
        torch._C._set_neg(t, True)
        return torch.ones(2, 2)

    probe = torch.zeros(2)
    torch._C._set_neg(probe, True)
    with pytest.raises(RuntimeError) as refused:  # what torch says when the bits of such a tensor are read
        probe.view(torch.int32)
    head, payload = observe(negated, CONTIGUOUS)  # a contiguous argument: its bits are read without a copy
    assert head["argument_unreadable"] == f"RuntimeError: {refused.value}"
    assert "argument" not in head and payload == f32(1.0, 1.0, 1.0, 1.0)  # the result's bits only
    answer = decode(head, payload)
    assert answer.argument is None
    assert input_problem(answer, CONTIGUOUS) == "the input could not be read after the call"


def test_call_target_calls_in_this_process_and_decodes_the_one_answer() -> None:
    outcome = call_target(summed, STRIDED)
    assert outcome.case is STRIDED and outcome.failure is None and len(outcome.answers) == 1
    answer = outcome.answer
    assert answer is not None and answer.rank is None and answer.type_name == "Tensor"
    values = well_formed(outcome)
    assert values is not None and values.tolist() == [[6.0, 8.0], [10.0, 12.0]]


# --- decode: every field checked ------------------------------------------------------------------------


def _good() -> tuple[dict[str, Any], bytes]:
    head, payload = observe(summed, STRIDED)
    return json.loads(json.dumps(head)), payload


def test_decode_rebuilds_the_answer_from_the_header_and_the_bits() -> None:
    head, payload = _good()
    answer = decode(head, payload)
    assert (answer.type_name, answer.raised, answer.traceback, answer.rank, answer.returned_none) == (
        "Tensor",
        "",
        "",
        None,
        False,
    )
    r, x = answer.result, answer.argument
    assert r is not None and x is not None
    assert (r.shape, r.stride, r.dtype, r.device) == ((2, 2), (2, 1), "torch.float32", "cpu")
    assert (x.shape, x.stride, x.dtype, x.device) == ((2, 2, 2), (8, 4, 2), "torch.float32", "cpu")
    assert r.storage == tuple(head["result"]["storage"]) and x.storage == tuple(head["argument"]["storage"])
    assert r.bits is not None and r.bits.dtype == torch.int32 and r.bits.shape == (2, 2)
    assert r.values is not None and r.values.tolist() == [[6.0, 8.0], [10.0, 12.0]]
    assert x.values is not None and x.values.flatten().tolist() == list(VALUES)
    assert TensorView((2,), (1,), "torch.float32", "cpu").values is None


def test_decode_reads_a_header_without_result_or_argument_and_any_rank() -> None:
    bare: dict[str, object] = {"type": "NoneType", "raised": "E: x", "traceback": "tb", "returned_none": True}
    assert decode({**bare, "rank": 3}, b"") == Answer("NoneType", None, None, "E: x", "tb", 3, True)
    assert decode(bare, b"").rank is None
    head, payload = _good()
    head["result"].update(storage=None, bits=0)
    answer = decode(head, payload[16:])
    assert answer.result is not None and answer.result.storage is None and answer.result.bits is None
    head["result"].update(shape=[0, 2], dtype="torch.int8", device="meta")  # no bits: any tensor
    assert decode(head, payload[16:]).result == TensorView((0, 2), (2, 1), "torch.int8", "meta")
    head, payload = _good()
    head["result"].update(dtype="torch.float16", shape=[2, 4])  # 16 bytes are 8 float16s as well
    half = decode(head, payload).result
    assert half is not None and half.bits is not None and half.bits.dtype == torch.int16
    assert half.values is not None and half.values.shape == (2, 4)


def _set(where: str, **fields: object) -> Callable[[dict[str, Any]], None]:
    return lambda h: (h if where == "head" else h[where]).update(fields)


def _drop(where: str, name: str) -> Callable[[dict[str, Any]], None]:
    return lambda h: (h if where == "head" else h[where]).pop(name)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (_set("head", result=[1]), "result is not an object"),
        (_set("head", argument="x"), "argument is not an object"),
        (_set("result", shape=(2, 2)), "result.shape is not a list of integers"),
        (_set("result", shape=[2, 2.0]), "result.shape is not a list of integers"),
        (_set("result", shape=[True, 2]), "result.shape is not a list of integers"),
        (_drop("result", "shape"), "result.shape is not a list of integers"),
        (_set("argument", stride=[8, "4", 2]), "argument.stride is not a list of integers"),
        (_set("result", dtype=None), "result.dtype is not a string"),
        (_set("argument", device=0), "argument.device is not a string"),
        (_set("result", storage="0-16"), "result.storage is not a list of integers"),
        (_set("result", storage=[0, 1.5]), "result.storage is not a list of integers"),
        (_set("argument", storage=[1]), "argument.storage is not a start and an end"),
        (_set("argument", storage=[1, 2, 3]), "argument.storage is not a start and an end"),
        (_set("result", bits="16"), "result.bits is not a byte count within the payload"),
        (_set("result", bits=True), "result.bits is not a byte count within the payload"),
        (_set("result", bits=-1), "result.bits is not a byte count within the payload"),
        (_set("result", bits=49), "result.bits is not a byte count within the payload"),
        (_drop("result", "bits"), "result.bits is not a byte count within the payload"),
        (_set("argument", bits=33), "argument.bits is not a byte count within the payload"),
        (_set("result", dtype="torch.int32"), "result has bits but is not a CPU tensor of a tester dtype"),
        (_set("result", device="meta"), "result has bits but is not a CPU tensor of a tester dtype"),
        (_set("result", shape=[-2, -2]), "result has bits but is not a CPU tensor of a tester dtype"),
        (_set("result", shape=[3, 2]), "result has 16 bytes of bits for shape (3, 2)"),
        (_set("result", shape=[0, 2]), "result has 16 bytes of bits for shape (0, 2)"),
        (_set("result", dtype="torch.float64"), "result has 16 bytes of bits for shape (2, 2)"),
        (_set("result", bits=0), "16 unexplained payload bytes"),
        (_set("argument", bits=0), "32 unexplained payload bytes"),
        (_drop("head", "argument"), "32 unexplained payload bytes"),
        (_set("head", rank="0"), "rank is not an integer"),
        (_set("head", rank=False), "rank is not an integer"),
        (_set("head", returned_none=0), "returned_none is not a boolean"),
        (_drop("head", "returned_none"), "returned_none is not a boolean"),
        (_set("head", type=None), "type is not a string"),
        (_drop("head", "raised"), "raised is not a string"),
        (_set("head", traceback=[]), "traceback is not a string"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_decode_refuses_each_malformed_field_naming_it(
    change: Callable[[dict[str, Any]], None], words: str
) -> None:
    head, payload = _good()
    change(head)
    with pytest.raises(Garbled) as refused:
        decode(head, payload)
    assert str(refused.value) == words


def test_decode_refuses_a_header_that_is_not_an_object_and_bytes_left_over() -> None:
    head, payload = _good()
    for not_an_object in ([head], "{}", None):
        with pytest.raises(Garbled) as refused:
            decode(not_an_object, payload)
        assert str(refused.value) == "the header is not an object"
    with pytest.raises(Garbled) as refused:
        decode(head, payload + b"xyz")
    assert str(refused.value) == "3 unexplained payload bytes"
    assert issubclass(Garbled, ValueError)


# --- judgments: the result, the input, aliasing ---------------------------------------------------------


def _view(
    values: list[float],
    shape: tuple[int, ...] = (2, 2),
    stride: tuple[int, ...] | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    storage: tuple[int, int] | None = None,
) -> TensorView:
    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    bits = torch.tensor(values, dtype=dtype).view(width).reshape(shape)
    natural = torch.empty(shape).stride()
    return TensorView(shape, stride or natural, str(dtype), device, storage, bits)


RESULT = [6.0, 8.0, 10.0, 12.0]
ARGUMENT = _view(list(VALUES), (2, 2, 2), (8, 4, 2))


def test_result_tensor_is_the_values_of_a_well_formed_result_only() -> None:
    good = Answer("Tensor", _view(RESULT), ARGUMENT)
    values = result_tensor(good, STRIDED)
    assert (
        values is not None and values.dtype == torch.float32 and values.tolist() == [[6.0, 8.0], [10.0, 12.0]]
    )
    assert result_tensor(Answer("Tensor", _view(RESULT), ARGUMENT, raised="E: x"), STRIDED) is None
    assert result_tensor(Answer("int", None, ARGUMENT), STRIDED) is None
    no_bits = TensorView((2, 2), (2, 1), "torch.float32", "cpu")
    assert result_tensor(Answer("Tensor", no_bits, ARGUMENT), STRIDED) is None
    for wrong in [
        _view(RESULT, (4,)),
        _view(RESULT, (1, 2, 2)),
        _view(RESULT, (2, 1, 2)),
        _view(RESULT, dtype=torch.float64),
        _view(RESULT, device="meta"),
    ]:
        assert result_tensor(Answer("Tensor", wrong, ARGUMENT), STRIDED) is None, wrong
    flat = Case(2, 4, (), torch.float32, "contiguous", VALUES)
    flat_values = result_tensor(Answer("Tensor", _view(RESULT, (4,)), None), flat)
    assert flat_values is not None and flat_values.tolist() == RESULT


def test_well_formed_takes_the_answer_of_the_rank_asked_for_and_none_after_a_failure() -> None:
    rank0 = Answer("Tensor", _view([1.0, 2.0, 3.0, 4.0]), None, rank=0)
    rank1 = Answer("Tensor", _view([5.0, 6.0, 7.0, 8.0]), None, rank=1)
    group = Outcome(CONTIGUOUS, (rank0, rank1))
    for rank, first in [(0, 1.0), (1, 5.0)]:
        values = well_formed(group, rank)
        assert values is not None and values[0, 0].item() == first
    assert well_formed(group, 2) is None and well_formed(group) is None
    assert well_formed(Outcome(CONTIGUOUS, (rank0, rank1), Failure("crashed", "rank 1 died")), 0) is None
    stacked = Answer("Tensor", _view(RESULT), ARGUMENT)
    assert well_formed(Outcome(STRIDED, (stacked,))) is not None
    assert well_formed(Outcome(STRIDED, (stacked,), Failure("timed-out", "no answer"))) is None


def test_the_one_answer_of_an_outcome_is_a_stacked_calls_that_answered() -> None:
    stacked = Answer("Tensor", _view(RESULT), ARGUMENT)
    assert Outcome(STRIDED, (stacked,)).answer is stacked
    assert Outcome(STRIDED, (stacked,), Failure("crashed", "died")).answer is None
    assert Outcome(STRIDED).answer is None
    assert Outcome(STRIDED, (stacked, stacked)).answer is None
    assert Outcome(CONTIGUOUS, (Answer("Tensor", rank=0),)).answer is None


def test_an_unchanged_input_has_no_problem_and_a_changed_element_is_named() -> None:
    assert input_problem(Answer("Tensor", _view(RESULT), ARGUMENT), STRIDED) == ""
    changed = list(VALUES)
    changed[2], changed[7] = -0.5, 9.0  # elements (0, 1, 0) and (1, 1, 1): the first in index order is named
    answer = Answer("Tensor", _view(RESULT), _view(changed, (2, 2, 2), (8, 4, 2)))
    assert input_problem(answer, STRIDED) == "the input was modified: element (0, 1, 0) was 3.0, is now -0.5"
    zeros = Case(2, 2, (), torch.float16, "contiguous", (0.0, 0.0, 0.0, 0.0))
    signed = Answer("Tensor", None, _view([0.0, 0.0, 0.0, -0.0], (2, 2), dtype=torch.float16))
    assert input_problem(signed, zeros) == "the input was modified: element (1, 1) was 0.0, is now -0.0"


def test_an_input_whose_layout_changed_or_that_was_not_read_is_a_problem() -> None:
    moved = Answer("Tensor", None, _view(list(VALUES), (2, 2, 2), (4, 8, 2)))
    assert input_problem(moved, STRIDED) == (
        "the input's shape/stride/dtype changed from (2, 2, 2)/(8, 4, 2)/torch.float32 "
        "to (2, 2, 2)/(4, 8, 2)/torch.float32"
    )
    widened = Answer("Tensor", None, _view(list(VALUES), (2, 2, 2), (8, 4, 2), dtype=torch.float64))
    assert (
        "changed from (2, 2, 2)/(8, 4, 2)/torch.float32 to (2, 2, 2)/(8, 4, 2)/torch.float64"
        in input_problem(widened, STRIDED)
    )
    resized = Answer("Tensor", None, TensorView((3,), (1,), "torch.float32", "cpu"))
    assert input_problem(resized, STRIDED) == (
        "the input's shape/stride/dtype changed from (2, 2, 2)/(8, 4, 2)/torch.float32 "
        "to (3,)/(1,)/torch.float32"
    )
    unread = Answer("Tensor", None, TensorView((2, 2, 2), (8, 4, 2), "torch.float32", "cpu"))
    assert input_problem(unread, STRIDED) == "the input could not be read after the call"
    assert input_problem(Answer("Tensor"), STRIDED) == "the input could not be read after the call"


def test_a_rank_may_change_its_argument_only_when_working_in_place() -> None:
    after = _view([0.0, 6.0, 7.0, 8.0], storage=(100, 116))  # rank 1's argument with its first element zeroed
    separate = _view(RESULT, storage=(200, 216))
    inside = _view(RESULT, storage=(108, 124))
    told = "the input was modified: element (0, 0) was 5.0, is now 0.0"  # judged against rank 1's own values
    assert input_problem(Answer("Tensor", separate, after, rank=1), CONTIGUOUS) == told
    assert input_problem(Answer("NoneType", after, after, rank=1, returned_none=True), CONTIGUOUS) == ""
    assert input_problem(Answer("Tensor", inside, after, rank=1), CONTIGUOUS) == ""
    rank0 = _view([1.0, 2.0, 3.0, 4.0], storage=(100, 116))
    assert input_problem(Answer("Tensor", separate, rank0, rank=0), CONTIGUOUS) == ""
    # A stacked call is judged whatever it returned: sharing the input does not excuse changing it.
    zeroed = list(VALUES)
    zeroed[0] = 0.0
    stacked_after = _view(zeroed, (2, 2, 2), (8, 4, 2), storage=(100, 164))
    for answer in [
        Answer("Tensor", _view(RESULT, storage=(100, 116)), stacked_after),
        Answer("NoneType", None, stacked_after, returned_none=True),
    ]:
        assert (
            input_problem(answer, STRIDED) == "the input was modified: element (0, 0, 0) was 1.0, is now 0.0"
        )


@pytest.mark.parametrize(
    ("result", "argument", "overlap"),
    [
        ((0, 16), (16, 32), False),
        ((16, 32), (0, 16), False),
        ((0, 17), (16, 32), True),
        ((31, 40), (16, 32), True),
        ((20, 24), (16, 32), True),
        ((16, 32), (16, 32), True),
        (None, (16, 32), False),
        ((16, 32), None, False),
    ],
    ids=str,
)
def test_aliasing_is_overlapping_storage_ranges_of_a_stacked_call(
    result: tuple[int, int] | None, argument: tuple[int, int] | None, overlap: bool
) -> None:
    r = _view(RESULT, storage=result)
    x = _view(list(VALUES), (2, 2, 2), (8, 4, 2), storage=argument)
    assert aliases(Answer("Tensor", r, x)) == overlap
    assert not aliases(Answer("Tensor", r, x, rank=0))  # a rank may return its argument
    assert not aliases(Answer("Tensor", None, x)) and not aliases(Answer("Tensor", r, None))
