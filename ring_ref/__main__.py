"""``python -m ring_ref``: the same as the ``ring-ref`` command."""

import sys

from ring_ref._cli import main

sys.exit(main())
