"""``python -m sessionloop``: the same command line as the ``sessionloop`` script."""

from sessionloop.cli.main import main

main()
