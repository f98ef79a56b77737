"""``python -m hetero_nn``: the ``hetero-nn`` command (see :mod:`hetero_nn.cli`)."""

import sys

try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C while the command starts: one line, as later
    print("hetero-nn: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

raise SystemExit(main())
