"""``python -m echo2_cli``: the same as the ``echo2`` command."""

from .cli import main

main()
