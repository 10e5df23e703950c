"""``python -m machine``: the ``turnstile`` command line (`machine.cli`)."""

import sys

from machine.cli import main

if __name__ == "__main__":
    sys.exit(main())
