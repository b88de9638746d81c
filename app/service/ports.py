"""The edges the service is built with, as protocols: the model table and the vocabularies.

Where the operator's key goes is each dialect's (``Dialect.key_slots``), not a table here.

``app.main`` injects the real ones (``app.model_table``, ``app.tokenizer``); tests inject fakes.
"""

from __future__ import annotations

from typing import Protocol

from ..core.registry import ModelSpec
from ..core.tokens import TokenCounter

REQUIRED_ENCODINGS: tuple[str, ...] = ("o200k_base", "cl100k_base")


class ModelResolver(Protocol):
    """The model table as the service sees it (``app.model_table.ModelRegistry``)."""

    def resolve(self, model: str, /) -> ModelSpec: ...


class Vocabularies(Protocol):
    """The tokenizer edge (``app.tokenizer``), injectable so tests can use a word counter."""

    def counter_for(self, encoding: str, /) -> TokenCounter: ...

    def preload(self) -> None: ...

    def loaded_encodings(self) -> tuple[str, ...]: ...


class SummaryEvents(Protocol):
    """Where the summaries report, per wire API (``app.observability.Observability``): every
    summary call (``outcome``: ``ok``, ``timeout``, ``http_<status>``, ``empty``, ``failed``; the
    tokens sent and the summary's tokens) and every request's lookup of its memory in the cache."""

    def record_summary(
        self, *, api: str | None, outcome: str, tokens_in: int = 0, tokens_out: int = 0
    ) -> None: ...

    def record_summary_cache(self, *, api: str | None, hit: bool, error: bool = False) -> None: ...
