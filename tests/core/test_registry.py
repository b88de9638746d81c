"""ModelRegistry: parsing and validating tables, resolution order, merging and defaults."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.errors import CoreError, InvalidModelTable
from app.core.registry import ENCODINGS, MAX_STRIPPED_SEGMENTS, ModelRegistry, ModelSpec

TABLE = """
[default]
window = 8_192
max_output = 4_096
encoding = "estimate"

[models]
"gpt-4" = { window = 8_192, max_output = 8_192, encoding = "cl100k_base" }
"gpt-4o" = { window = 128_000, max_output = 16_384, encoding = "o200k_base" }
"gpt-4o-mini" = { window = 128_000, max_output = 16_384, encoding = "o200k_base" }
"gpt-4o-2024-05-13" = { window = 128_000, max_output = 4_096, encoding = "o200k_base" }
"mistral" = { window = 32_768, max_output = 32_768 }
"mixtral-8x7b" = { window = 32_768, max_output = 8_000 }
"Llama-3.1" = { window = 131_072 }

[models."claude-sonnet-4"]
window = 200_000
max_output = 64_000
encoding = "estimate"
"""


@pytest.fixture(scope="module")
def registry() -> ModelRegistry:
    return ModelRegistry.from_toml(TABLE, source="builtin")


def spec(name: str, window: int, max_output: int, encoding: str = "estimate", **kw: object) -> ModelSpec:
    return ModelSpec(name=name, window_tokens=window, max_output_tokens=max_output, encoding=encoding, **kw)  # type: ignore[arg-type]


# ---- parsing -----------------------------------------------------------------------------------


def test_from_toml_reads_inline_and_long_form_entries(registry: ModelRegistry) -> None:
    by_key = {s.matched: s for s in registry.entries()}
    assert by_key["gpt-4o"].window_tokens == 128_000
    assert by_key["gpt-4o"].max_output_tokens == 16_384
    assert by_key["gpt-4o"].encoding == "o200k_base"
    assert by_key["claude-sonnet-4"].window_tokens == 200_000
    assert by_key["claude-sonnet-4"].max_output_tokens == 64_000
    assert all(s.source == "builtin" for s in by_key.values())
    assert len(registry) == 8


def test_encoding_defaults_to_estimate_and_max_output_to_window(registry: ModelRegistry) -> None:
    llama = registry.resolve("llama-3.1-8b-instruct")
    assert llama.encoding == "estimate"
    assert llama.max_output_tokens == llama.window_tokens == 131_072


def test_entries_are_sorted_and_named_by_key(registry: ModelRegistry) -> None:
    names = [s.name for s in registry.entries()]
    assert names == sorted(names, key=str.lower)
    assert all(s.name == s.matched and not s.guessed for s in registry.entries())


def test_default_table_is_used_and_fallback_when_absent(registry: ModelRegistry) -> None:
    assert registry.default.window_tokens == 8_192
    bare = ModelRegistry.from_toml('[models]\n"x" = { window = 100 }\n', source="builtin")
    assert (bare.default.window_tokens, bare.default.max_output_tokens) == (8_192, 4_096)
    assert bare.default.encoding == "estimate"
    empty = ModelRegistry.from_toml("", source="operator")
    assert len(empty) == 0
    assert empty.resolve("anything").guessed


# ---- resolution ----------------------------------------------------------------------------------


def test_exact_match(registry: ModelRegistry) -> None:
    got = registry.resolve("gpt-4o")
    assert (got.name, got.matched, got.guessed, got.window_tokens) == ("gpt-4o", "gpt-4o", False, 128_000)


def test_exact_beats_prefix_for_a_snapshot_with_its_own_figures(registry: ModelRegistry) -> None:
    assert registry.resolve("gpt-4o-2024-05-13").max_output_tokens == 4_096
    assert registry.resolve("gpt-4o-2024-05-13").matched == "gpt-4o-2024-05-13"


def test_dated_snapshot_resolves_to_its_family(registry: ModelRegistry) -> None:
    got = registry.resolve("gpt-4o-2024-08-06")
    assert got.matched == "gpt-4o"
    assert got.name == "gpt-4o-2024-08-06"
    assert got.max_output_tokens == 16_384
    assert not got.guessed


def test_longest_prefix_wins(registry: ModelRegistry) -> None:
    assert registry.resolve("gpt-4o-mini").matched == "gpt-4o-mini"
    assert registry.resolve("gpt-4o-mini-2024-07-18").matched == "gpt-4o-mini"
    assert registry.resolve("gpt-4-0613").matched == "gpt-4"
    assert registry.resolve("gpt-4o-audio-preview").matched == "gpt-4o"


def test_unknown_model_gets_the_default_flagged_guessed(registry: ModelRegistry) -> None:
    got = registry.resolve("totally-unknown-7b")
    assert got.guessed is True
    assert got.source == "default"
    assert got.matched is None
    assert got.name == "totally-unknown-7b"
    assert (got.window_tokens, got.max_output_tokens, got.encoding) == (8_192, 4_096, "estimate")


def test_matching_is_case_insensitive_and_keeps_the_requested_name(registry: ModelRegistry) -> None:
    got = registry.resolve("GPT-4O-Mini")
    assert got.matched == "gpt-4o-mini"
    assert got.name == "GPT-4O-Mini"
    assert registry.resolve("llama-3.1-70b").matched == "Llama-3.1"  # the key as written


def test_provider_prefix_is_stripped(registry: ModelRegistry) -> None:
    assert registry.resolve("openai/gpt-4o").matched == "gpt-4o"
    assert registry.resolve("openai/gpt-4o-mini-2024-07-18").matched == "gpt-4o-mini"
    assert registry.resolve("anthropic/claude-sonnet-4").matched == "claude-sonnet-4"
    assert registry.resolve("meta-llama/Llama-3.1-8B-Instruct").matched == "Llama-3.1"
    assert registry.resolve("openrouter/openai/gpt-4o").matched == "gpt-4o"
    assert registry.resolve("openai/").guessed


def test_prefix_never_swallows_a_slash(registry: ModelRegistry) -> None:
    # "mistral" is a prefix of the full string, but the model after the slash is Mixtral.
    assert registry.resolve("mistralai/Mixtral-8x7B-Instruct-v0.1").matched == "mixtral-8x7b"
    assert registry.resolve("mistralai/unknown-model").guessed


def test_exact_on_a_stripped_name_beats_a_prefix_on_the_full_name() -> None:
    table = ModelRegistry(
        {"gateway/": spec("gateway/", 4_096, 1_024), "gpt-4o": spec("gpt-4o", 128_000, 16_384)},
        default=spec("default", 8_192, 4_096),
    )
    assert table.resolve("gateway/gpt-4o").matched == "gpt-4o"
    assert table.resolve("gateway/my-deployment").matched == "gateway/"
    assert table.resolve("gateway/my-deployment").window_tokens == 4_096


def test_a_full_name_key_beats_the_stripped_name() -> None:
    table = ModelRegistry(
        {
            "azure/gpt-4o": spec("azure/gpt-4o", 64_000, 4_096),
            "gpt-4o": spec("gpt-4o", 128_000, 16_384),
        },
        default=spec("default", 8_192, 4_096),
    )
    assert table.resolve("azure/gpt-4o").window_tokens == 64_000
    assert table.resolve("azure/gpt-4o-2024-08-06").window_tokens == 64_000
    assert table.resolve("openai/gpt-4o").window_tokens == 128_000


def test_stripping_is_bounded_for_hostile_names(registry: ModelRegistry) -> None:
    deep = "/".join(["p"] * (MAX_STRIPPED_SEGMENTS + 1)) + "/gpt-4o"
    assert registry.resolve(deep).guessed
    shallow = "/".join(["p"] * MAX_STRIPPED_SEGMENTS) + "/gpt-4o"
    assert registry.resolve(shallow).matched == "gpt-4o"
    huge = "x/" * 50_000 + "gpt-4o"
    assert registry.resolve(huge).guessed


def test_empty_model_name_gets_the_default(registry: ModelRegistry) -> None:
    assert registry.resolve("").guessed


# ---- reference model for the resolution rules -----------------------------------------------------


def reference_resolve(entries: dict[str, ModelSpec], model: str) -> str | None:
    """A deliberately naive linear-scan statement of the documented rules."""
    folded = {k.lower(): k for k in entries}
    candidates = [model.lower()]
    while len(candidates) <= MAX_STRIPPED_SEGMENTS and "/" in candidates[-1]:
        tail = candidates[-1].split("/", 1)[1]
        if not tail:
            break
        candidates.append(tail)
    for c in candidates:
        if c in folded:
            return folded[c]
    for c in candidates:
        hits = [k for k in folded if c.startswith(k) and "/" not in c[len(k) :]]
        if hits:
            return folded[max(hits, key=len)]
    return None


_ALPHABET = st.sampled_from(list("ab-/.4o"))
_KEYS = st.text(_ALPHABET, min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(keys=st.sets(_KEYS, max_size=12), models=st.lists(st.text(_ALPHABET, max_size=14), max_size=8))
def test_resolution_matches_the_reference(keys: set[str], models: list[str]) -> None:
    lowered: dict[str, str] = {}
    for k in keys:
        lowered.setdefault(k.lower(), k)
    entries = {k: spec(k, 1_000, 100) for k in lowered.values()}
    table = ModelRegistry(entries, default=spec("default", 8_192, 4_096))
    for model in models:
        got = table.resolve(model)
        expected = reference_resolve(entries, model)
        assert got.matched == expected
        assert got.guessed is (expected is None)
        assert got.name == model


# ---- merging and defaults -------------------------------------------------------------------------


def test_operator_entries_override_and_add(registry: ModelRegistry) -> None:
    operator = ModelRegistry.from_toml(
        """
        [models]
        "GPT-4o" = { window = 64_000, max_output = 4_096, encoding = "o200k_base" }
        "my-finetune" = { window = 16_000, max_output = 2_000 }
        """,
        source="operator",
    )
    merged = registry.merged(operator)
    gpt = merged.resolve("gpt-4o-2024-08-06")
    assert (gpt.window_tokens, gpt.source, gpt.matched) == (64_000, "operator", "GPT-4o")
    assert merged.resolve("my-finetune-v2").window_tokens == 16_000
    assert merged.resolve("gpt-4o-mini").source == "builtin"
    assert len(merged) == len(registry) + 1
    # the operator declared no [default]: ours stays
    assert merged.default == registry.default
    # merging never mutates either side
    assert registry.resolve("gpt-4o").window_tokens == 128_000


def test_operator_default_overrides_ours(registry: ModelRegistry) -> None:
    operator = ModelRegistry.from_toml("[default]\nwindow = 32_000\nmax_output = 2_000\n", source="operator")
    merged = registry.merged(operator)
    got = merged.resolve("unknown")
    assert (got.window_tokens, got.max_output_tokens, got.guessed, got.source) == (
        32_000,
        2_000,
        True,
        "default",
    )


def test_with_default(registry: ModelRegistry) -> None:
    changed = registry.with_default(window_tokens=65_536, max_output_tokens=8_192)
    got = changed.resolve("unknown")
    assert (got.window_tokens, got.max_output_tokens, got.encoding) == (65_536, 8_192, "estimate")
    assert changed.resolve("gpt-4o").window_tokens == 128_000
    assert registry.resolve("unknown").window_tokens == 8_192
    assert changed.default.source == registry.default.source == "builtin"
    relabelled = registry.with_default(window_tokens=4_096, max_output_tokens=1_024, source="settings")
    assert relabelled.default.source == "settings"
    assert relabelled.resolve("unknown").source == "default"  # a guess is always labelled a guess
    with pytest.raises(InvalidModelTable, match="exceeds"):
        registry.with_default(window_tokens=1_000, max_output_tokens=2_000)
    with pytest.raises(InvalidModelTable, match="positive integer"):
        registry.with_default(window_tokens=0, max_output_tokens=0)


def test_constructor_validates_specs_and_case_duplicates() -> None:
    default = spec("default", 8_192, 4_096)
    with pytest.raises(InvalidModelTable, match="differ only in case"):
        ModelRegistry({"gpt-4o": spec("a", 10, 5), "GPT-4o": spec("b", 10, 5)}, default=default)
    with pytest.raises(InvalidModelTable, match="encoding"):
        ModelRegistry({"x": spec("x", 10, 5, encoding="p50k_base")}, default=default)
    with pytest.raises(InvalidModelTable, match="must not be empty"):
        ModelRegistry({"": spec("x", 10, 5)}, default=default)
    with pytest.raises(InvalidModelTable, match=r"default\.max_output"):
        ModelRegistry({}, default=spec("default", 10, 11))


def test_resolve_returns_frozen_specs(registry: ModelRegistry) -> None:
    got = registry.resolve("gpt-4o")
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.window_tokens = 1  # type: ignore[misc]


# ---- invalid tables -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [
        ('[models]\n"m" = { window = 0 }', 'models."m".window', "positive integer, got 0"),
        ('[models]\n"m" = { window = -5 }', 'models."m".window', "positive integer"),
        ('[models]\n"m" = { window = 1.5 }', 'models."m".window', "positive integer"),
        ('[models]\n"m" = { window = true }', 'models."m".window', "positive integer"),
        ('[models]\n"m" = { window = "128k" }', 'models."m".window', "positive integer"),
        ('[models]\n"m" = { max_output = 10 }', 'models."m".window', "missing 'window'"),
        ('[models]\n"m" = { window = 100, max_output = 101 }', 'models."m".max_output', "exceeds its window"),
        ('[models]\n"m" = { window = 100, max_output = 0 }', 'models."m".max_output', "positive integer"),
        ('[models]\n"m" = { window = 100, encoding = "p50k_base" }', 'models."m".encoding', "must be one of"),
        ('[models]\n"m" = { window = 100, encoding = 7 }', 'models."m".encoding', "must be one of"),
        ('[models]\n"m" = { window = 100, max_ouput = 10 }', 'models."m".max_ouput', "unknown field"),
        ('[models]\n"m" = 128000', 'models."m"', "must be a table"),
        ("models = 3", "models", "table of model entries"),
        ("[model]\nx = 1", "model", "unknown top-level"),
        ("[default]\nwindow = 0", "default.window", "positive integer"),
        ("[default]\nmax_output = 10", "default.window", "missing 'window'"),
    ],
)
def test_invalid_tables_are_rejected_with_the_key(text: str, key: str, fragment: str) -> None:
    with pytest.raises(InvalidModelTable) as info:
        ModelRegistry.from_toml(text, source="operator")
    assert info.value.key == key
    assert info.value.source == "operator"
    assert fragment in info.value.message
    assert "operator model table" in str(info.value)
    assert isinstance(info.value, CoreError)


def test_malformed_toml_is_rejected() -> None:
    with pytest.raises(InvalidModelTable, match="not valid TOML") as info:
        ModelRegistry.from_toml('[models]\n"m" = { window = ', source="operator")
    assert info.value.key is None


def test_case_duplicate_keys_in_a_table_are_rejected() -> None:
    text = '[models]\n"gpt-4o" = { window = 10 }\n"GPT-4o" = { window = 20 }\n'
    with pytest.raises(InvalidModelTable, match="differ only in case"):
        ModelRegistry.from_toml(text, source="operator")


def test_encodings_constant_is_unchanged() -> None:
    assert frozenset({"o200k_base", "cl100k_base", "estimate"}) == ENCODINGS


def test_a_name_resolves_to_the_same_spec_each_time() -> None:
    table = ModelRegistry({"gpt-4o": spec("gpt-4o", 128_000, 16_384)}, default=spec("default", 8_192, 4_096))
    first = table.resolve("gpt-4o-mini")
    assert table.resolve("gpt-4o-mini") is first
    fresh = ModelRegistry({"gpt-4o": spec("gpt-4o", 128_000, 16_384)}, default=spec("default", 8_192, 4_096))
    assert fresh.resolve("gpt-4o-mini") == first and table.resolve("other").guessed
