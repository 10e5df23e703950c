"""``python -m machine``: the ``turnstile`` command line (`machine.cli.main`)."""

import sys

from machine.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
