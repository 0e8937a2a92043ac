"""``python -m fastpp``: the ``fastpp`` command line (an entry point, imported by nothing)."""

from fastpp.cli.app import main

main()
