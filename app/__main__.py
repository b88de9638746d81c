"""``python -m app``: the same as the ``ctxproxy`` console script."""

from .cli import main

raise SystemExit(main())
