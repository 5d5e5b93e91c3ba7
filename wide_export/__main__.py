"""`python -m wide_export` = the `wide-export` command."""

from wide_export.cli import main

main()
