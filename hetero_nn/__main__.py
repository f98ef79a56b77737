"""``python -m hetero_nn``: the ``hetero-nn`` command (see :mod:`hetero_nn.cli`)."""

from .cli import main

raise SystemExit(main())
