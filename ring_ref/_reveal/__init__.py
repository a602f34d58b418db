"""``ring-ref reveal``: the summation tree of every result element, found from the target's outputs alone.

The idea is FPRev's (Xie et al., "Revealing the Order of Floating-Point
Summation by Numerical Testing", USENIX ATC 2025): give two workers ``+M`` and
``-M``, so large that adding anything small to them changes nothing, and the
rest small values.  Inside the subtree where ``+M`` meets ``-M`` every small
value is swamped; the two then cancel exactly, and every small value added
later survives.  FPRev gives the others the value 1 and reads *how many*
survived, one pair of workers per call (``N^2`` calls).  Here:

* **Distinct powers of two.**  Worker ``w`` holds ``2**w``, so the output is the
  bit set of the survivors and names *which* workers the subtree holds: the
  lowest common ancestor of the two, as a set of leaves (clause ``reveal-probes``).
* **Every element at once.**  Each element of the result is its own sum over
  the workers, so one call carries a different pattern per element; elements
  whose answers agree so far share one state.  The number of calls depends on
  ``N`` and the trees, not on ``M``.
* **Top-down, several questions per call.**  Each element keeps the subtrees it
  knows; every maximal subtree whose children are not yet known gets one
  question per call (they are disjoint, so their answers do not mix).  An
  answer is a new subtree, or the whole subtree again, which says the two
  workers lie on different sides of its root; once those "different sides"
  facts connect all parts of a subtree they fix its split without a call.
  Pairs of workers adjacent on the ring are asked first, which is what
  makes a ring fold cost about ``N`` calls.
* **Checked.**  A subtree that was inferred rather than seen is asked once
  more (its two sides must swamp everything else in it), and the trees are then
  evaluated on random inputs and compared with the target bit for bit.
* **Counts beyond.**  Where ``N`` exceeds the significand, and for elements
  whose set answers fit no binary tree, FPRev's count probes (units instead
  of powers of two; clause ``reveal-counts``) with its pivot recursion, every
  element its own question per call: a ring's fold in at most ``N + 2`` calls.
  They also read multiway nodes (``k >= 3`` terms rounded once) and name an
  element whose outputs are the exact sum correctly rounded ``exact``; any
  other element that no tree explains gets none (``None``), with the reason.

Limits (clause ``reveal-limits``): ``N <= 65536`` in float32 and float64,
2048 in float16, 256 in bfloat16 (counts of ``N`` units must be exact).

The modules, each one job: ``_target`` (the limits and a checked call of
the target), ``_probe`` (the set-probe search, then counts), ``_count`` (the
count-probe search), ``_check`` (the random-input check), ``_revealed``
(``reveal()`` and its report).  The trees themselves, their text, JSON and
sums, and ring fitting are the order model's (:mod:`ring_ref._order`); the
picture is :func:`ring_ref._svg.reveal_svg`.
"""

from ring_ref._reveal._check import CHECKS
from ring_ref._reveal._revealed import REVEAL_FORMAT, REVEAL_VERSION, Classification, Kind, Revealed, reveal
from ring_ref._reveal._target import LIMITS, SET_LIMITS, RevealError, check_reveal_size

__all__ = [
    "CHECKS",
    "LIMITS",
    "REVEAL_FORMAT",
    "REVEAL_VERSION",
    "SET_LIMITS",
    "Classification",
    "Kind",
    "RevealError",
    "Revealed",
    "check_reveal_size",
    "reveal",
]
