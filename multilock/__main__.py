"""``python -m multilock``: the command line."""

from ._cli import main

main()
