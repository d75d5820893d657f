"""`python -m hotplate.cli`: the same entry point as the `hotplate` command."""

from hotplate.cli import main

main()
