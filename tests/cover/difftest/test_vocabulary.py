"""The ``op=`` each kind of target is given (``ring_ref.difftest._vocabulary.op_argument``).

A stacked target and an MPI rank get the op's name, the one
:func:`ring_ref.ring_all_reduce` takes; a gloo rank gets the member of
``torch.distributed.ReduceOp`` that ``torch.distributed.all_reduce`` takes,
written out by hand in ``tests/common/oracles.py``.
"""

from __future__ import annotations

import pytest

from ring_ref.difftest._vocabulary import Op, Ranks, op_argument
from tests.common.oracles import REDUCE_OPS

pytestmark = pytest.mark.clause("difftest-ops")


@pytest.mark.parametrize("op", list(REDUCE_OPS))
@pytest.mark.parametrize("ranks", [None, "mpi"])
def test_a_stacked_target_and_an_mpi_rank_get_the_op_by_name(op: Op, ranks: Ranks | None) -> None:
    got = op_argument(op, ranks)
    assert type(got) is str and got == op


@pytest.mark.parametrize("op", list(REDUCE_OPS))
def test_a_gloo_rank_gets_the_reduce_op_torch_distributed_takes(op: Op) -> None:
    got = op_argument(op, "gloo")
    assert not isinstance(got, str)
    assert [name for name, member in REDUCE_OPS.items() if member == got] == [op]
