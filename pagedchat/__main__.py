"""`python -m pagedchat ...` runs the same command as the `pagedchat` script."""

from pagedchat.cli import main

raise SystemExit(main())
