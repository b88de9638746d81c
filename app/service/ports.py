"""The edges the service is built with, as protocols: the model table and the vocabularies.

``app.main`` injects the real ones (``app.model_table``, ``app.tokenizer``); tests inject fakes.
"""

from __future__ import annotations

from typing import Protocol

from ..core.registry import ModelSpec
from ..core.tokens import TokenCounter

CHAT_PATH = "chat/completions"
REQUIRED_ENCODINGS: tuple[str, ...] = ("o200k_base", "cl100k_base")
# Where the operator's upstream key goes, per dialect name (any other path: where the client put
# its own). OpenAI's APIs want ``Authorization: Bearer``, Anthropic's ``x-api-key``, whatever
# header the client used for its own key.
UPSTREAM_KEY_HEADERS: dict[str, str] = {
    "chat": "authorization",
    "responses": "authorization",
    "messages": "x-api-key",
}


class ModelResolver(Protocol):
    """The model table as the service sees it (``app.model_table.ModelRegistry``)."""

    def resolve(self, model: str, /) -> ModelSpec: ...


class Vocabularies(Protocol):
    """The tokenizer edge (``app.tokenizer``), injectable so tests can use a word counter."""

    def counter_for(self, encoding: str, /) -> TokenCounter: ...

    def preload(self) -> None: ...

    def loaded_encodings(self) -> tuple[str, ...]: ...
