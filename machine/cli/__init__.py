"""The ``turnstile`` command line: `machine.cli.main` (its entry point), ``turnstile run``'s
script runner (`machine.cli.runner`), ``turnstile explore`` (`machine.cli.explore`),
``turnstile diagrams`` (`machine.cli.diagrams`), log-file validation and JUnit reports
(`machine.cli.logfiles`, `machine.cli.junit`), argument types (`machine.cli.argtypes`) and
the terminal every command line writes to (`machine.cli.terminal`). The conformance kit's
and the store's subcommands live with their packages.

Nothing is imported here, so that a command line's module loads only what it uses.
"""
