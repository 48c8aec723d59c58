"""``python -m searcher.cli``: the ``slotsweep`` command where its console script is not on PATH."""

from searcher.cli.commands import main

raise SystemExit(main())
