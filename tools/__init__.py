"""Developer tools that stand outside the ``ring_ref`` package (they never import it)."""
