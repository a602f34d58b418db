"""Launchers: how a target is run on a case, kept apart from how its answer is checked.

A :class:`Launcher` turns a :class:`Case` into an :class:`Outcome` (what came
back, or how the call failed to answer, and what the target printed); the
search, the oracles and the diagnosis only ever see outcomes.

* :class:`InProcess` calls the target in the tester's own process: for a
  function that cannot be imported by name (a lambda, a local function), or
  when asked (``--in-process``).  The report says ``isolated: false``.
* :class:`Isolated` runs the target in a :class:`~ring_ref.difftest._worker.Worker`
  process that imports it by name; the worker is reused across cases and
  restarted after it dies or is killed for running past the time limit.
* :class:`~ring_ref.difftest._ranks.GlooRanks` runs a per-rank target on every
  rank of a gloo process group (:mod:`ring_ref.difftest._ranks`), and
  :class:`~ring_ref.difftest._mpi.MpiRanks` on every rank of an MPI job.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

from ring_ref.difftest._call import Failure, Garbled, Outcome, call_target, decode
from ring_ref.difftest._inputs import Case
from ring_ref.difftest._loading import TargetError
from ring_ref.difftest._vocabulary import Framework, OpTarget, Target
from ring_ref.difftest._worker import Died, Stuck, Worker, trim

__all__ = ["InProcess", "Isolated", "Launcher", "OutputLog", "as_launcher"]

OUTPUT_LIMIT = 2000
"""Characters of the target's output kept for the report, per call and per run (start and end)."""


class OutputLog:
    """What the target wrote during a run: the byte count, and its start and end for the report."""

    def __init__(self) -> None:
        self.bytes = 0
        self._head = ""
        self._tail = ""
        self._chars = 0

    def add(self, text: str) -> None:
        """Record ``text`` (one call's output)."""
        self.bytes += len(text.encode(errors="replace"))
        self._chars += len(text)
        if len(self._head) < OUTPUT_LIMIT:
            take = OUTPUT_LIMIT - len(self._head)
            self._head, text = self._head + text[:take], text[take:]
        self._tail = (self._tail + text)[-OUTPUT_LIMIT:]

    @property
    def text(self) -> str:
        """The output, trimmed to its first and last :data:`OUTPUT_LIMIT` characters."""
        left_out = self._chars - len(self._head) - len(self._tail)
        if left_out <= 0:
            return self._head + self._tail
        return f"{self._head}\n... ({left_out} characters left out) ...\n{self._tail}"


class Launcher(ABC):
    """Runs a target on cases (see the module docstring); :meth:`close` ends whatever it started.

    ``kind`` names it in the report; ``per_rank`` launchers call the target on
    every rank of a group (:mod:`ring_ref.difftest._ranks`) and give one answer per rank.
    ``min_workers`` is the smallest ``N`` it can run (a job's world size under
    ``--ranks job``); ``broken``, once a call has left it unable to call the
    target again (a job whose ranks are stuck in the target), says why.
    """

    isolated: bool
    kind: str
    per_rank: bool = False
    min_workers: int = 1
    broken: str = ""
    output: OutputLog

    @property
    def tested_n(self) -> list[int] | None:
        """The ``N`` it called, for the report (a job's launcher only; ``None``: the report leaves it out)."""
        return None

    @abstractmethod
    def start(self) -> None:
        """Get ready to call the target; :class:`TargetError` if it cannot be loaded."""

    @abstractmethod
    def call(self, case: Case) -> Outcome:
        """One call of the target on ``case``."""

    @abstractmethod
    def close(self) -> None:
        """Stop every process this launcher started."""


class InProcess(Launcher):
    """The target called directly in the tester's process (no isolation, no time limit)."""

    isolated = False
    kind = "in-process"

    def __init__(self, fn: Target) -> None:
        self.fn = fn
        self.output = OutputLog()

    def start(self) -> None:
        """Nothing to start."""

    def call(self, case: Case) -> Outcome:
        """Call the target here; a ``KeyboardInterrupt`` stops the tester, any other exception is recorded."""
        return call_target(self.fn, case)

    def close(self) -> None:
        """Nothing to stop."""


class Isolated(Launcher):
    """The target, imported by name, in a worker process; ``timeout_s`` bounds each call.

    ``framework``: what the target takes (``jax``: a ``jax.Array``, :mod:`ring_ref.difftest._jax`).
    """

    isolated = True
    kind = "isolated"

    def __init__(self, target: str, timeout_s: float, framework: Framework = "torch") -> None:
        self.worker = Worker(target, framework=framework)
        self.timeout_s = timeout_s
        self.output = OutputLog()

    def start(self) -> None:
        """Fork the worker and load the target (:class:`TargetError` if it cannot be loaded)."""
        try:
            self.worker.start(self.timeout_s)
        finally:
            self.output.add(self.worker.read_output())

    def call(self, case: Case) -> Outcome:
        """Send ``case`` to the worker (restarted if needed); wait at most ``timeout_s`` for the answer."""
        if not self.worker.running:
            try:
                self.start()
            except TargetError as exc:
                return Outcome(case, failure=Failure("crashed", f"restarting the worker failed: {exc}"))
        self.worker.send(case)
        got = self.worker.receive(time.monotonic() + self.timeout_s)
        output = self.worker.read_output()
        self.output.add(output)
        outcome = Outcome(case, output=trim(output, OUTPUT_LIMIT))
        if isinstance(got, Stuck):
            outcome.failure = Failure(
                "timed-out",
                f"no answer within {self.timeout_s:g} s (--timeout); the worker was killed",
                got.stack,
            )
        elif isinstance(got, Died):
            outcome.failure = Failure("crashed", got.text, got.stack)
        else:
            try:
                if got.head.get("kind") != "answer" or got.head.get("rank") is not None:
                    raise Garbled(f"expected an answer, got {got.head.get('kind')!r}")
                outcome.answers = (decode(got.head, got.payload),)
            except Garbled as exc:
                self.worker.kill()
                outcome.failure = Failure("crashed", f"its reply was garbled ({exc}); the worker was killed")
        return outcome

    def close(self) -> None:
        """Kill the worker and its process group."""
        self.worker.close()


def as_launcher(fn: Target | OpTarget | Launcher) -> Launcher:
    """``fn`` itself when it is a launcher, else ``fn`` called in-process."""
    return fn if isinstance(fn, Launcher) else InProcess(fn)
