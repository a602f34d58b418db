"""The command line: ``python -m ring_ref`` and the ``ring-ref`` console script."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ring_ref
from ring_ref._cli import build_parser, main
from ring_ref.difftest import difftest
from tests.common.paths import ROOT


@pytest.mark.clause("worked-example", "round-count")
def test_demo_prints_the_worked_example_and_every_round_for_n4(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "after reduce-scatter round 0: worker buffers [[1.0, 6.0], [4.0, 4.0]]" in out
    assert "ring_all_reduce(x) = [4.0, 6.0]" in out
    for phase in ("reduce-scatter", "all-gather"):
        for r in range(3):
            assert f"{phase} round {r} " in out
    assert f"{phase} round 3 " not in out


def test_python_dash_m_and_console_script_run() -> None:
    module = subprocess.run(
        [sys.executable, "-m", "ring_ref", "demo"], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert "[4.0, 6.0]" in module.stdout
    script = shutil.which("ring-ref", path=str(Path(sys.executable).parent))
    assert script is not None, "the ring-ref console script is not installed next to this Python"
    console = subprocess.run([script, "demo"], capture_output=True, text=True, check=True, cwd=ROOT)
    assert console.stdout == module.stdout


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["no-such-command"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_vectors_into_a_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "not-a-dir"
    target.write_text("keep me", encoding="utf-8")
    assert main(["vectors", "--out", str(target)]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert target.read_text(encoding="utf-8") == "keep me"


def test_version_is_the_package_version_and_the_citation_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out.split()
    citation = {
        key.strip(): value.strip().strip('"')
        for key, _, value in (
            line.partition(":") for line in (ROOT / "CITATION.cff").read_text(encoding="utf-8").splitlines()
        )
    }
    assert printed == ["ring-ref", importlib.metadata.version("ring-ref")]
    assert citation["version"] == ring_ref.__version__ == printed[1]


def test_vectors_into_an_empty_path_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["vectors", "--out", ""]) == 2
    assert "--out must name a directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("fmt", "too_many", "hint"),
    [("svg", 9, "--format table (N <= 16)"), ("table", 17, "--format json (N <= 64)"), ("json", 65, "-n")],
)
def test_trace_refuses_rings_it_cannot_show_readably(
    fmt: str, too_many: int, hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trace", "-n", str(too_many), "--format", fmt]) == 2
    err = capsys.readouterr().err
    assert f"N = {too_many} workers is too many to show readably as {fmt}" in err and hint in err
    assert main(["trace", "-n", str(too_many - 1), "-m", str(too_many - 1), "--format", fmt]) == 0


@pytest.mark.clause("difftest-exact-orders")
def test_a_schedule_that_starts_with_a_dash_or_is_unknown_is_told_the_command_line_syntax(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue #29 item 13: ``--schedule -1,2,blocks`` (argparse reads it as an option) and an unknown name."""
    for command in (["trace", "-n", "3"], ["difftest", "ring_ref:ring_all_reduce"]):
        with pytest.raises(SystemExit) as stopped:
            main([*command, "--schedule", "-1,2,blocks"])
        assert stopped.value.code == 2
        assert "write --schedule=-1,2,blocks" in capsys.readouterr().err
        assert main([*command, "--schedule", "ring"]) == 2
        err = capsys.readouterr().err
        assert "unknown schedule 'ring'" in err and "--schedule=-1,2,blocks on the command line" in err
    assert main(["trace", "-n", "3", "--schedule=-1,2,blocks"]) == 0
    assert "direction -1, offset 2, layout blocks" in capsys.readouterr().out


@pytest.mark.clause("schedule-below-n")
def test_a_trace_of_a_named_library_ring_below_n_elements_traces_what_the_library_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["trace", "-n", "4", "-m", "1", "--schedule", "openmpi-ring"]) == 0
    assert capsys.readouterr().out.startswith("schedule: recursive doubling, layout blocks")
    assert main(["trace", "-n", "4", "-m", "4", "--schedule", "openmpi-ring"]) == 0
    assert capsys.readouterr().out.startswith("ring: direction +1, offset 0, layout blocks")
    assert main(["trace", "-n", "4", "-m", "1", "--schedule=1,0,blocks"]) == 0  # a ring as text: the ring
    assert capsys.readouterr().out.startswith("ring: direction +1, offset 0, layout blocks")


@pytest.mark.clause("reveal-report")
def test_reveal_of_an_order_that_is_no_ring_suggests_difftest_and_still_exits_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["reveal", "tests.common.planted_impls:gather_adds", "-n", "3", "-m", "3"]) == 0
    assert "run: ring-ref difftest tests.common.planted_impls:gather_adds" in capsys.readouterr().err
    assert main(["reveal", "ring_ref:ring_all_reduce", "-n", "3", "-m", "3"]) == 0
    assert "ring-ref difftest" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "options"),
    [
        (["--ranks", "gloo", "--in-process"], {"ranks": "gloo", "isolate": False}),
        (["--mca", "btl=self"], {"mca": {"btl": "self"}}),
        (["--env", "I_MPI_ADJUST_ALLREDUCE=8"], {"env": {"I_MPI_ADJUST_ALLREDUCE": "8"}}),
        (["--ranks", "gloo", "--mpiexec", "/v/bin/mpiexec"], {"ranks": "gloo", "mpiexec": "/v/bin/mpiexec"}),
        (["--ranks", "mpi", "--env", "9LIVES=1"], {"ranks": "mpi", "env": {"9LIVES": "1"}}),
        (["--ranks", "mpi", "--dtypes", "bfloat16"], {"ranks": "mpi", "dtypes": [torch.bfloat16]}),
        (["--subgroups"], {"subgroups": True}),
        (["--op", "max", "--schedule", "auto"], {"op": "max", "schedule": "auto"}),
    ],
)
def test_a_broken_option_rule_is_exit_2_in_the_words_the_api_raises(
    argv: list[str], options: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    """One set of option rules (difftest's ``_options.refused``): the command line says what the API says."""
    target = "ring_ref:ring_all_reduce"
    assert main(["difftest", target, "--examples", "1", *argv]) == 2
    said = capsys.readouterr().err
    with pytest.raises(ValueError) as refused:
        difftest(target, examples=1, **options)  # type: ignore[arg-type]
    assert said == f"ring-ref difftest: error: {refused.value}\n"


_USAGE: list[tuple[list[str], int]] = [
    (["--help"], 0),
    (["--version"], 0),
    *[
        ([command, "--help"], 0)
        for command in ("demo", "trace", "vectors", "difftest", "reveal", "invariance")
    ],
    (["difftest", "--max-workers", "0", "x:y"], 2),
    (["difftest", "--maxworkers", "3", "x:y"], 2),
    (["difftest", "--examples", "0", "x:y"], 2),
    (["difftest", "--seed", "-1", "x:y"], 2),
    (["difftest", "--timeout", "0", "x:y"], 2),
    (["difftest", "--dtypes", "float8", "x:y"], 2),
    (["difftest", "--mca", "btl", "x:y"], 2),
    (["difftest", "--device", "cpu", "x:y"], 2),
    (["difftest", "--subgroups", "x:y"], 2),
    (["difftest", "--mca", "btl=self", "x:y"], 2),
    (["difftest", "--ranks", "gloo", "--in-process", "x:y"], 2),
    (["difftest", "--mode", "fast", "x:y"], 2),
    (["reveal", "x:y", "-n", "3"], 2),
    (["reveal", "x:y", "-n", "3", "-m", "4", "--dtype", "int8"], 2),
    (["invariance", "x:y", "-n", "3", "--sizes", "1,a"], 2),
    (["invariance", "x:y", "-n", "3", "--sizes", "4", "--svg", "f.svg", "--by-bits"], 2),
    (["invariance", "x:y", "-n", "3", "--sizes", "4", "--mca", "btl"], 2),
    (["invariance", "x:y", "-n", "3", "--sizes", "4", "--env", "A=1"], 2),
    (["invariance", "x:y", "-n", "3", "--sizes", "4", "--ranks", "mpi-job", "--env", "A=1"], 2),
    (["difftest", "--ranks", "mpi", "--env", "A", "x:y"], 2),
    (["reveal", "x:y", "-n", "3", "-m", "4", "--env", "A=1"], 2),
    (["reveal", "x:y", "-n", "3", "-m", "4", "--ranks", "gloo", "--mca", "btl=self"], 2),
    (["reveal", "x:y", "-n", "3", "-m", "4", "--ranks", "mpi", "--env", "A-B=1"], 2),
    (["trace"], 2),
    (["trace", "-n", "4", "--format", "png"], 2),
    (["vectors"], 2),
    (["vectors", "--out", " "], 2),
]

_LOADED = """
import contextlib, io, json, sys
from ring_ref._cli import main
seen = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            status = main(argv)
        except SystemExit as stop:
            status = stop.code
    seen.append([status, sorted({"torch", "numpy"} & set(sys.modules))])
print(json.dumps(seen))
"""


@pytest.mark.clause("cli-arguments-first")
def test_help_and_usage_errors_answer_without_importing_torch() -> None:
    """``--help`` of every sub-command and every usage error that needs no target are answered with
    neither torch nor numpy imported (``sys.modules`` of a fresh interpreter, after each)."""
    argvs = [argv for argv, _ in _USAGE]
    done = subprocess.run(
        [sys.executable, "-c", _LOADED, json.dumps(argvs)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    seen = json.loads(done.stdout)
    assert seen == [[status, []] for _, status in _USAGE], list(zip(argvs, seen, strict=True))


@pytest.mark.clause("cli-arguments-first")
def test_python_dash_m_refuses_max_workers_0_without_importing_torch() -> None:
    """The issue's case, as a user runs it: ``python -m ring_ref`` (the package's own ``__init__`` and
    ``__main__`` on the path), exit 2 and the API's words, no torch among the imports."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ring_ref", "difftest", "--max-workers", "0", "x:y"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 2
    assert (
        "ring-ref difftest: error: max_workers (--max-workers) must be between 1 and 64; got 0" in done.stderr
    )
    imported = {
        line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")
    }
    assert "ring_ref._cli" in imported
    assert not {"torch", "numpy"} & imported


@pytest.mark.clause("cli-arguments-first")
def test_the_command_lines_names_are_the_tools() -> None:
    """The choices and defaults the parser shows without torch are the ones the tools use."""
    from ring_ref import _names
    from ring_ref._dtypes import FORMATS
    from ring_ref._order_stability import BITS_DRAWS, DEFAULT_PROBE
    from ring_ref._reveal import CHECKS, LIMITS
    from ring_ref.difftest import DTYPES

    assert _names.DTYPE_NAMES == tuple(FORMATS) == tuple(LIMITS) == tuple(DTYPES)
    assert (_names.REVEAL_CHECKS, _names.INVARIANCE_PROBE, _names.INVARIANCE_DRAWS) == (
        CHECKS,
        DEFAULT_PROBE,
        BITS_DRAWS,
    )


@pytest.mark.clause("cli-arguments-first")
def test_an_early_refusal_is_the_apis_words(capsys: pytest.CaptureFixture[str]) -> None:
    """A rule checked before torch is imported says what the API raises for the same options."""
    assert main(["difftest", "ring_ref:ring_all_reduce", "--max-workers", "65"]) == 2
    said = capsys.readouterr().err
    with pytest.raises(ValueError) as refused:
        difftest("ring_ref:ring_all_reduce", max_workers=65)
    assert said == f"ring-ref difftest: error: {refused.value}\n"


@pytest.mark.clause("difftest-rank-env")
@pytest.mark.parametrize("command", ["difftest", "reveal", "invariance"])
def test_env_mca_and_mpiexec_are_for_the_mpi_ranks_the_tester_starts(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--env`` on every command that runs per-rank targets, refused (exit 2, before torch) without ranks
    the tester starts: a job someone else started has its environment already; ``--mpiexec`` without
    ``--ranks mpi``."""
    sizes = {"difftest": [], "reveal": ["-n", "2", "-m", "2"], "invariance": ["-n", "2", "--sizes", "4"]}
    base = [command, "x:y", *sizes[command]]
    assert main([*base, "--ranks", "mpi-job", "--env", "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=ring"]) == 2
    said = capsys.readouterr().err
    assert "needs ranks 'gloo', 'mpi', 'jax', 'mlx'" in said and "mpiexec -genv NAME VALUE" in said
    assert main([*base, "--ranks", "gloo", "--mpiexec", "/usr/bin/mpiexec"]) == 2
    assert "mpiexec (--mpiexec) is the launcher the tester starts an MPI job with" in capsys.readouterr().err
    assert main([*base, "--ranks", "mpi", "--env", "NOT A NAME=1"]) == 2
    assert "names must be NAME=VALUE with NAME letters, digits and '_'" in capsys.readouterr().err
    argv = [*base, "--ranks", "mpi", "--env", "A=1=2", "--env", "B=", "--mca", "k=v"]
    parsed = build_parser().parse_args(argv)
    assert (parsed.env, parsed.mca, parsed.mpiexec) == (["A=1=2", "B="], ["k=v"], None)


@pytest.mark.clause("difftest-job")
def test_reveal_runs_in_the_users_own_mpi_job() -> None:
    """``reveal --ranks mpi-job`` parses (it was ``invalid choice``)."""
    argv = ["reveal", "x:y", "-n", "4", "-m", "9", "--ranks", "mpi-job"]
    assert build_parser().parse_args(argv).ranks == "mpi-job"
