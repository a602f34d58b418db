"""The training step of ``examples/data_parallel_step.py`` on three gloo processes, end to end.

Microbatch accumulation weighted by example count, one optimizer step on the combined gradient,
then one update of the exponential moving average; and the pitfall of stepping Adam on each rank
and averaging the weights, with plain SGD as the case where that is harmless.  The oracles are
single-process: the full-batch gradient and optimizer step, and the ranks' buckets rebuilt and
summed with the simulation ``ring_ref.ring_all_reduce``.
"""

from __future__ import annotations

import importlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from ring_ref import ring_all_reduce
from ring_ref._processes._gloo import ProcessRing
from tests.common.oracles import same_bits
from tests.common.paths import ROOT

# Imported by name here and, through sys.path (spawned ranks inherit it), on every rank.
sys.path.insert(0, str(ROOT / "examples"))
dp: Any = importlib.import_module("data_parallel_step")

N = 3
MICROBATCHES = ((1,), (2, 1), (3, 1))  # unequal ranks, unequal microbatches (a short last one)
CALL_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def ring() -> Iterator[ProcessRing]:
    processes = ProcessRing(N, group_timeout_s=CALL_TIMEOUT_S)
    try:
        yield processes
    finally:
        processes.close()


def full_batch_gradient(spec: Any) -> torch.Tensor:
    inputs, targets = dp.global_batch(spec.total)
    return dp.mean_loss_gradient(dp.tiny_model(), inputs, targets)  # type: ignore[no-any-return]


def simulated_gradient(spec: Any) -> torch.Tensor:
    """The ranks' buckets (accumulated gradient, count) rebuilt in one process, summed by the simulation."""
    inputs, targets = dp.global_batch(spec.total)
    model = dp.tiny_model()
    buckets = []
    for rank, sizes in enumerate(spec.microbatches):
        local = spec.rank_examples(rank)
        summed, count = dp.accumulated_gradient(model, inputs[local], targets[local], sizes)
        buckets.append(torch.cat([summed, count]))
    length = buckets[0].numel()
    stacked = torch.stack([torch.cat([b, b.new_zeros((-length) % N)]) for b in buckets])
    total = ring_all_reduce(stacked)[:length]
    return total[:-1] / total[-1]


def stepped(spec: Any, gradient: torch.Tensor) -> torch.Tensor:
    """Parameters after one optimizer step on ``gradient`` from the initial model, in one process."""
    model = dp.tiny_model()
    optimizer = dp.make_optimizer(spec, model)
    dp.set_gradients(model, gradient)
    optimizer.step()
    return dp.flat_parameters(model)  # type: ignore[no-any-return]


def test_microbatch_accumulation_is_weighted_by_example_count(ring: ProcessRing) -> None:
    spec = dp.StepSpec(MICROBATCHES)
    per_rank = ring.run(dp.training_step, spec, timeout_s=CALL_TIMEOUT_S)
    expected = simulated_gradient(spec)
    for result in per_rank:
        assert same_bits(result["gradient"], expected), "the ring's bits are the simulation's"
    full = full_batch_gradient(spec)
    torch.testing.assert_close(expected, full, rtol=1e-12, atol=1e-14)
    # The weighting matters here: the plain mean of the five microbatch means is far off.
    inputs, targets = dp.global_batch(spec.total)
    means, start = [], 0
    for size in (s for sizes in MICROBATCHES for s in sizes):
        mb = slice(start, start + size)
        means.append(dp.mean_loss_gradient(dp.tiny_model(), inputs[mb], targets[mb]))
        start += size
    assert float((torch.stack(means).mean(0) - full).abs().max()) > 1e-3


def test_one_optimizer_step_then_one_ema_update(ring: ProcessRing) -> None:
    spec = dp.StepSpec(MICROBATCHES, optimizer="adam", lr=0.1, ema_decay=0.9)
    per_rank = ring.run(dp.training_step, spec, timeout_s=CALL_TIMEOUT_S)
    initial = dp.flat_parameters(dp.tiny_model())
    after = stepped(spec, simulated_gradient(spec))
    large_batch = stepped(spec, full_batch_gradient(spec))
    for result in per_rank:
        assert same_bits(result["parameters"], after), "one step on the combined gradient, on every rank"
        assert same_bits(result["ema"], per_rank[0]["ema"]), "every rank holds the same EMA"
    torch.testing.assert_close(after, large_batch, rtol=1e-9, atol=1e-12)
    ema = per_rank[0]["ema"]
    torch.testing.assert_close(ema, 0.9 * initial + 0.1 * after, rtol=0, atol=1e-15)
    # Updated after the step, from the new parameters: not the initial ones, not a copy of the new ones.
    assert float((ema - initial).abs().max()) > 1e-3
    assert float((ema - after).abs().max()) > 1e-3


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_independent_steps_then_averaged_weights(ring: ProcessRing, optimizer: str) -> None:
    """Adam on each rank, weights averaged: a different step.  Plain SGD: the same step, to rounding."""
    spec = dp.StepSpec(MICROBATCHES, optimizer=optimizer, lr=0.1)
    per_rank = ring.run(dp.averaged_independent_steps, spec, timeout_s=CALL_TIMEOUT_S)
    combined = per_rank[0]["combined"]
    assert same_bits(combined, stepped(spec, simulated_gradient(spec)))
    for result in per_rank:
        assert same_bits(result["averaged"], per_rank[0]["averaged"])
    gap = float((per_rank[0]["averaged"] - combined).abs().max())
    rounding = 16 * torch.finfo(dp.DTYPE).eps * float(combined.abs().max())
    if optimizer == "adam":
        assert gap > 1e6 * rounding, f"Adam's independent steps must differ beyond rounding; gap {gap:.3e}"
    else:
        assert gap <= rounding, (
            f"SGD is linear in the gradient: the steps must agree to rounding; gap {gap:.3e}"
        )


@pytest.mark.soak  # torchrun starts its own three ranks (tens of seconds here)
def test_the_example_under_torchrun_prints_the_documented_figures() -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3"]
    launcher = subprocess.Popen(
        [*command, str(ROOT / "examples" / "data_parallel_step.py"), "--batch-sizes", "1,3,4"],
        cwd=ROOT,
        env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = launcher.communicate(timeout=CALL_TIMEOUT_S * 3)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()
    assert launcher.returncode == 0, stdout + stderr
    figures = dict(
        re.findall(r"^\s+(weighted by example count|Adam|SGD):?\s+.*?([0-9.]+e[-+]\d+)$", stdout, re.M)
    )
    assert float(figures["weighted by example count"]) < 1e-12, stdout
    assert float(figures["Adam"]) > 1e-3, stdout
    assert float(figures["SGD"]) < 1e-14, stdout
