"""Model facts as data: window, max output and tokenizer for a model name.

INTERFACE CONTRACT (other modules rely on these names and signatures):

* ``ModelSpec`` (frozen): ``name``, ``window_tokens``, ``max_output_tokens``, ``encoding``
  (``"o200k_base"``, ``"cl100k_base"`` or ``"estimate"``), ``source`` (where the figures came from:
  ``"builtin"``, ``"operator"``, ``"default"``, ... ), ``matched`` (the table key that matched,
  or None), and ``guessed`` (True when no entry matched and the default was used). Extensions set by
  ``app.core.knowledge`` (the table itself leaves them at their defaults): ``sources`` (pairs
  ``(figure, source)`` for ``window``, ``max_output``, ``encoding`` and ``correction``; ``source``
  then names the window's) and ``correction`` (the calibrated factor applied to the estimate, 1.0
  when none applies).
* ``ModelRegistry.resolve(model) -> ModelSpec``: exact match, then longest prefix, then default.
* ``ModelRegistry(entries, *, default)``, ``ModelRegistry.from_toml(text, *, source)``
  (raises ``InvalidModelTable``), ``merged(other)``, ``with_default(*, window_tokens,
  max_output_tokens, source=None)``, ``entries()`` and ``default`` (the spec used when nothing
  matches; its ``source`` says which table, or ``"settings"``, its figures came from).

Resolution rules (case-insensitive throughout):

1. The candidates are the name itself, then the name with its leading ``segment/`` stripped, one
   segment at a time (at most ``MAX_STRIPPED_SEGMENTS``): ``openrouter/openai/gpt-4o`` tries
   ``openrouter/openai/gpt-4o``, ``openai/gpt-4o``, ``gpt-4o``. This is how OpenRouter names
   (``anthropic/claude-sonnet-4``), Hugging Face ids served by vLLM (``meta-llama/Llama-3.1-8B``,
   ``Qwen/Qwen3-8B``) and gateway prefixes resolve without one entry per provider.
2. An exact key match on any candidate wins (the full name first).
3. Otherwise the longest key that is a prefix of a candidate wins (the full name first), so
   ``gpt-4o-2024-08-06`` resolves to ``gpt-4o`` and ``gpt-4o-mini-2024-07-18`` to ``gpt-4o-mini``.
   A prefix match may not swallow a ``/``: the part of the candidate after the key contains no
   ``/``, so the key ``mistral`` never claims ``mistralai/mixtral-8x7b``. A key ending in ``/``
   (``"my-gateway/"``) therefore covers every model of that gateway.
4. Otherwise the default, with ``guessed=True`` and ``source="default"``.

The returned spec's ``name`` is the requested model, ``matched`` the table key as written.
Lookups are dictionary probes, one per distinct key length, so resolution costs the same for a
table of ten entries or ten thousand.

Table format (TOML)::

    [default]                       # optional; used when nothing matches
    window = 8192
    max_output = 4096
    encoding = "estimate"

    [models]
    "gpt-4o" = { window = 128_000, max_output = 16_384, encoding = "o200k_base" }

    [models."my-finetune"]          # the long form is the same thing
    window = 32_768
    max_output = 4_096              # optional: defaults to the window

``window`` is required, ``max_output`` defaults to ``window``, ``encoding`` to ``"estimate"``.
Unknown fields and tables are rejected (a typo must not silently fall back to the default).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .errors import InvalidModelTable

ENCODINGS: frozenset[str] = frozenset({"o200k_base", "cl100k_base", "estimate"})

MAX_STRIPPED_SEGMENTS = 3
"""How many leading ``segment/`` parts resolution strips; bounds the work for hostile names."""

FALLBACK_DEFAULT_WINDOW_TOKENS = 8192
FALLBACK_DEFAULT_MAX_OUTPUT_TOKENS = 4096

_ENTRY_FIELDS = frozenset({"window", "max_output", "encoding"})
_TOP_LEVEL = frozenset({"default", "models"})


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What we know about one model; ``guessed`` marks the configurable default."""

    name: str
    window_tokens: int
    max_output_tokens: int
    encoding: str
    source: str = "builtin"
    matched: str | None = None
    guessed: bool = False
    sources: tuple[tuple[str, str], ...] = ()
    correction: float = 1.0

    def source_of(self, figure: str) -> str:
        """Where ``figure`` (``window``, ``max_output``, ``encoding``, ``correction``) came from;
        ``source`` when no per-figure source was recorded."""
        for name, source in self.sources:
            if name == figure:
                return source
        return self.source


# Model names whose resolved spec is kept (clients name a handful; a bound all the same).
RESOLVED_MAX = 1024


def fallback_default() -> ModelSpec:
    """The default used when a table declares none: 8192 window, 4096 output, estimated."""
    return ModelSpec(
        name="default",
        window_tokens=FALLBACK_DEFAULT_WINDOW_TOKENS,
        max_output_tokens=FALLBACK_DEFAULT_MAX_OUTPUT_TOKENS,
        encoding="estimate",
        source="default",
    )


class ModelRegistry:
    """An immutable model table with precomputed lookups; see the module docstring for the rules."""

    __slots__ = ("_by_key", "_default", "_default_explicit", "_lengths", "_resolved")

    def __init__(self, entries: Mapping[str, ModelSpec], *, default: ModelSpec) -> None:
        by_key: dict[str, tuple[str, ModelSpec]] = {}
        for key, spec in entries.items():
            _check_spec(spec, where=f"models.{_quote(key)}", source=spec.source)
            folded = key.lower()
            if not folded:
                raise InvalidModelTable(
                    "model table keys must not be empty", key="models", source=spec.source
                )
            if folded in by_key:
                raise InvalidModelTable(
                    f"model table keys {_quote(by_key[folded][0])} and {_quote(key)} differ only "
                    "in case; keys are matched case-insensitively, keep one",
                    key=f"models.{_quote(key)}",
                    source=spec.source,
                )
            by_key[folded] = (key, spec)
        _check_spec(default, where="default", source=default.source)
        self._by_key = by_key
        self._default = default
        self._default_explicit = True
        self._lengths = tuple(sorted({len(k) for k in by_key}, reverse=True))
        # resolve() answers, per model name: the table never changes, and every request asks.
        # Bounded: RESOLVED_MAX names, then it starts over (a pure function of the table).
        self._resolved: dict[str, ModelSpec] = {}

    @classmethod
    def from_toml(cls, text: str, *, source: str) -> ModelRegistry:
        """Parse and validate a table; every entry (and the default, if given) gets ``source``."""
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InvalidModelTable(
                f"the {source} model table is not valid TOML: {exc}", source=source
            ) from exc
        unknown = sorted(set(data) - _TOP_LEVEL)
        if unknown:
            raise InvalidModelTable(
                f"the {source} model table has unknown top-level key(s) {', '.join(unknown)}; "
                "expected only [default] and [models]",
                key=unknown[0],
                source=source,
            )
        models = data.get("models", {})
        if not isinstance(models, dict):
            raise InvalidModelTable(
                f"the {source} model table: 'models' must be a table of model entries",
                key="models",
                source=source,
            )
        entries = {
            key: _parse_entry(key, value, where=f"models.{_quote(key)}", source=source)
            for key, value in models.items()
        }
        raw_default = data.get("default")
        if raw_default is None:
            registry = cls(entries, default=fallback_default())
            registry._default_explicit = False
            return registry
        default = _parse_entry("default", raw_default, where="default", source=source)
        return cls(entries, default=default)

    @property
    def default(self) -> ModelSpec:
        """The spec used (with ``guessed=True``) when no entry matches."""
        return self._default

    def merged(self, other: ModelRegistry) -> ModelRegistry:
        """Our entries overlaid with ``other``'s (case-insensitively), and ``other``'s default if
        it declared one."""
        combined: dict[str, tuple[str, ModelSpec]] = dict(self._by_key)
        combined.update(other._by_key)
        explicit = other._default_explicit
        default = other._default if explicit else self._default
        registry = ModelRegistry(dict(combined.values()), default=default)
        registry._default_explicit = explicit or self._default_explicit
        return registry

    def with_default(
        self, *, window_tokens: int, max_output_tokens: int, source: str | None = None
    ) -> ModelRegistry:
        """The same table with the default's window and max output replaced (encoding kept);
        ``source`` relabels the default (e.g. ``"settings"``) when given."""
        default = replace(
            self._default,
            window_tokens=window_tokens,
            max_output_tokens=max_output_tokens,
            source=self._default.source if source is None else source,
        )
        registry = ModelRegistry(dict(self._by_key.values()), default=default)
        registry._default_explicit = True
        return registry

    def entries(self) -> tuple[ModelSpec, ...]:
        """Every entry, sorted by key, with ``name`` and ``matched`` set to the key."""
        return tuple(replace(spec, name=key, matched=key) for _, (key, spec) in sorted(self._by_key.items()))

    def __len__(self) -> int:
        return len(self._by_key)

    def resolve(self, model: str) -> ModelSpec:
        """The spec for ``model``: exact, then longest prefix, then the default (guessed). The same
        (frozen) object for the same name, from the second time on (at most ``RESOLVED_MAX``
        names are kept; past that, the set starts over)."""
        spec = self._resolved.get(model)
        if spec is None:
            spec = self._resolve(model)
            if len(self._resolved) >= RESOLVED_MAX:
                self._resolved.clear()
            self._resolved[model] = spec
        return spec

    def _resolve(self, model: str) -> ModelSpec:
        candidates = _candidates(model.lower())
        for candidate in candidates:
            hit = self._by_key.get(candidate)
            if hit is not None:
                return replace(hit[1], name=model, matched=hit[0], guessed=False)
        for candidate in candidates:
            hit = self._longest_prefix(candidate)
            if hit is not None:
                return replace(hit[1], name=model, matched=hit[0], guessed=False)
        return replace(self._default, name=model, matched=None, guessed=True, source="default")

    def _longest_prefix(self, candidate: str) -> tuple[str, ModelSpec] | None:
        size = len(candidate)
        for length in self._lengths:
            if length >= size:
                continue
            hit = self._by_key.get(candidate[:length])
            if hit is not None and "/" not in candidate[length:]:
                return hit
        return None


def _candidates(folded: str) -> tuple[str, ...]:
    found = [folded]
    rest = folded
    for _ in range(MAX_STRIPPED_SEGMENTS):
        _, slash, tail = rest.partition("/")
        if not slash or not tail:
            break
        found.append(tail)
        rest = tail
    return tuple(found)


def _quote(key: str) -> str:
    escaped = key.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _parse_entry(name: str, value: Any, *, where: str, source: str) -> ModelSpec:
    if not isinstance(value, dict):
        raise InvalidModelTable(
            f"the {source} model table: {where} must be a table like "
            '{ window = 128000, max_output = 16384, encoding = "o200k_base" }',
            key=where,
            source=source,
        )
    unknown = sorted(set(value) - _ENTRY_FIELDS)
    if unknown:
        raise InvalidModelTable(
            f"the {source} model table: {where} has unknown field(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(_ENTRY_FIELDS))}",
            key=f"{where}.{unknown[0]}",
            source=source,
        )
    if "window" not in value:
        raise InvalidModelTable(
            f"the {source} model table: {where} is missing 'window'",
            key=f"{where}.window",
            source=source,
        )
    window = _positive_int(value["window"], where=f"{where}.window", source=source)
    max_output = _positive_int(value.get("max_output", window), where=f"{where}.max_output", source=source)
    encoding = value.get("encoding", "estimate")
    spec = ModelSpec(
        name=name,
        window_tokens=window,
        max_output_tokens=max_output,
        encoding=encoding,
        source=source,
    )
    _check_spec(spec, where=where, source=source)
    return spec


def _positive_int(value: Any, *, where: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidModelTable(
            f"the {source} model table: {where} must be a positive integer, got {value!r}",
            key=where,
            source=source,
        )
    return value


def _check_spec(spec: ModelSpec, *, where: str, source: str) -> None:
    for field, value in (("window", spec.window_tokens), ("max_output", spec.max_output_tokens)):
        _positive_int(value, where=f"{where}.{field}", source=source)
    if spec.max_output_tokens > spec.window_tokens:
        raise InvalidModelTable(
            f"the {source} model table: {where}.max_output ({spec.max_output_tokens}) exceeds "
            f"its window ({spec.window_tokens})",
            key=f"{where}.max_output",
            source=source,
        )
    if not isinstance(spec.encoding, str) or spec.encoding not in ENCODINGS:
        raise InvalidModelTable(
            f"the {source} model table: {where}.encoding must be one of "
            f"{', '.join(sorted(ENCODINGS))}, got {spec.encoding!r}",
            key=f"{where}.encoding",
            source=source,
        )
