"""The C consumer of the conformance vectors (``examples/c/ring_check.c``), compiled with the system ``cc``.

It must pass on the committed text vectors, fail on its planted bug, reject
malformed files, and its own 16-bit rounding must match torch's addition on
many more bit patterns than the vectors hold.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.common.oracles import bits
from tests.common.paths import ROOT

TEXT_FILE = ROOT / "spec" / "vectors" / "ring_all_reduce_v1.txt"
DOC: dict[str, Any] = json.loads(
    (ROOT / "spec" / "vectors" / "ring_all_reduce_v1.json").read_text(encoding="utf-8")
)
C_SOURCE = ROOT / "examples" / "c" / "ring_check.c"


def _compile(tmp_path: Path, name: str, *defines: str, source: Path = C_SOURCE) -> Path:
    cc = shutil.which("cc")
    assert cc is not None, "the C consumer test needs the system C compiler `cc` (apt-get install gcc)"
    exe = tmp_path / name
    subprocess.run(
        [
            cc,
            "-std=c99",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-ffp-contract=off",
            *defines,
            "-o",
            str(exe),
            str(source),
            "-lm",
        ],
        check=True,
        timeout=120,
    )
    return exe


@pytest.mark.clause("fold-order", "ag-copy-not-add")
def test_c_consumer_passes_on_the_vectors_and_fails_on_a_planted_bug(tmp_path: Path) -> None:
    exe = _compile(tmp_path, "ring_check")
    good = subprocess.run([exe, TEXT_FILE], capture_output=True, text=True, timeout=60, check=False)
    assert good.returncode == 0, good.stdout + good.stderr
    assert f"ring_check: {DOC['numberOfTests']} vectors passed, 0 failed" in good.stdout
    truncated = tmp_path / "truncated.txt"
    truncated.write_text(TEXT_FILE.read_text(encoding="utf-8")[:5000], encoding="utf-8")
    broken = subprocess.run([exe, truncated], capture_output=True, text=True, timeout=60, check=False)
    assert broken.returncode == 2, broken.stdout + broken.stderr
    assert "malformed vector file" in broken.stderr
    text = TEXT_FILE.read_text(encoding="utf-8")
    first_input = next(line for line in text.splitlines() if line.startswith("input "))
    bad_hex = tmp_path / "bad_hex.txt"
    bad_hex.write_text(text.replace(first_input, first_input[:-1] + "g", 1), encoding="utf-8")
    rejected = subprocess.run([exe, bad_hex], capture_output=True, text=True, timeout=60, check=False)
    assert rejected.returncode == 2, rejected.stdout + rejected.stderr
    assert "is not 4 hex digits" in rejected.stderr
    bad = subprocess.run(
        [_compile(tmp_path, "ring_check_bug", "-DPLANTED_BUG"), TEXT_FILE],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "buffers after all-gather round 0 differs" in bad.stdout
    assert "tcId 1: buffers after all-gather round 0 differs" in bad.stdout
    assert f"{DOC['numberOfTests']} vectors passed" not in bad.stdout


ADD_HARNESS = """\
#define main ring_check_main
#include "{source}"
#undef main
int main(void) {{
    int dtype;
    unsigned a, b;
    while (scanf("%d %x %x", &dtype, &a, &b) == 3)
        printf("%04llx\\n", (unsigned long long)add_bits(dtype, a, b));
    return 0;
}}
"""


@pytest.mark.parametrize(
    ("code", "dtype"), [(0, torch.float16), (1, torch.bfloat16)], ids=["float16", "bfloat16"]
)
@pytest.mark.clause("fold-order")
def test_c_consumer_16_bit_addition_matches_torch(tmp_path: Path, code: int, dtype: torch.dtype) -> None:
    """The C ring's own 16-bit rounding (decode, add in double, round half to even) against torch's
    addition on random bit patterns, beyond the few values the vectors hold: random pairs, and pairs a
    sign bit or an ulp apart for cancellation, ties and the subnormal/normal boundary."""
    harness = tmp_path / "add16.c"
    harness.write_text(ADD_HARNESS.format(source=C_SOURCE), encoding="utf-8")
    exe = _compile(tmp_path, "add16", source=harness)
    gen = torch.Generator().manual_seed(code)
    a = torch.randint(0, 1 << 16, (40_000,), generator=gen, dtype=torch.int32)
    flips = torch.tensor([0x8000, 0x8001, 0x0001, 0x0400, 0x0080], dtype=torch.int32)
    near = a[20_000:] ^ flips[torch.randint(0, len(flips), (20_000,), generator=gen)]
    b = torch.cat([torch.randint(0, 1 << 16, (20_000,), generator=gen, dtype=torch.int32), near])
    fa, fb = (t.to(torch.int16).view(dtype) for t in (a, b))
    finite = torch.isfinite(fa) & torch.isfinite(fb)
    a, b, want = a[finite], b[finite], (bits(fa[finite] + fb[finite]).to(torch.int32) & 0xFFFF).tolist()
    lines = "".join(f"{code} {x:x} {y:x}\n" for x, y in zip(a.tolist(), b.tolist(), strict=True))
    got = subprocess.run(
        [exe], input=lines, capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    assert len(got) == len(want) > 30_000
    wrong = [
        (f"{x:04x} + {y:04x}", g, f"{w:04x}")
        for x, y, g, w in zip(a.tolist(), b.tolist(), got, want, strict=True)
        if int(g, 16) != w
    ]
    assert wrong == [], wrong[:10]
