"""``python -m machine.conformance.corpus [--check] [IDS...]``: see `machine.conformance.corpus.build`."""

from __future__ import annotations

import sys

from machine.conformance.corpus.build import main

sys.exit(main(sys.argv[1:]))
