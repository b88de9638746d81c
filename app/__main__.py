"""``python -m ctxproxy`` (``python -m app`` in a checkout): the same as the ``ctxproxy`` console script."""

from .cli import main

raise SystemExit(main())
