"""The service layer: where the budget engine (``app.core``) meets the upstream (``app.upstream``).

* ``driver``: ``Service``, the request path (plan, send, classify, retry) and readiness.
* ``request``: the request's options and body parsing; ``report``: the plan as JSON.
* ``ports``: the protocols of the edges the service is built with (model table, vocabularies).
* ``fastpath``: large plans in a worker thread, and send-first for bodies that surely fit.
* ``summaries``: LLM summaries in place of dropped spans (building blocks in ``app.compaction``).
* ``learning``, ``discovery``, ``knowledge_share``: what the upstream teaches about windows and
  counts, asked for, learned from errors and usage, and shared between replicas.

Imports no web framework and nothing of ``app.api`` or ``app.main`` (``tests/test_architecture.py``).
"""
