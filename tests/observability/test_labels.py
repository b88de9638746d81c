"""Bounded labels: route, api, model (table, routes, discovered), upstream, free-form hook values."""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import Any

from app.observability.labels import (
    MAX_MODEL_LABELS,
    MAX_TOKEN_VALUES,
    MODEL_LABEL_MAX_CHARS,
    ApiLabels,
    ModelLabels,
    RouteLabels,
    TokenSet,
    UpstreamLabels,
    display_url,
    proxied,
    retry_outcomes,
    status_class,
)


@dataclass(frozen=True)
class Spec:
    matched: str | None
    guessed: bool


def table(model: str) -> Spec:
    for key in ("gpt-4o", "claude-"):
        if model.lower().startswith(key):
            return Spec(key, False)
    return Spec(None, True)


def test_model_labels_are_table_keys_route_keys_other_or_none() -> None:
    labels = ModelLabels(table, routes=["local/"])
    assert labels.label("gpt-4o-2024-08-06") == "gpt-4o"
    assert labels.label("claude-sonnet-4") == "claude-"
    assert labels.label("local/qwen") == "local/"
    assert labels.label("my secret prompt") == "other"
    assert labels.label(None) == "none" and labels.label("") == "none"


def test_model_labels_are_capped_even_when_every_name_is_known() -> None:
    labels = ModelLabels(lambda m: Spec(m, False), max_labels=50)
    rng = random.Random(3)
    seen = {labels.label("".join(rng.choices(string.ascii_letters, k=12))) for _ in range(1000)}
    assert len(seen) == 51 and "other" in seen


def test_a_failing_resolver_gives_other() -> None:
    def broken(model: str) -> Spec:
        raise ValueError(model)

    assert ModelLabels(broken).label("x") == "other"


def test_a_model_the_upstream_reported_is_its_own_label_and_only_that() -> None:
    reported = {"qwen3-coder-30b", "x" * 200}
    labels = ModelLabels(table, discovered=lambda m: m in reported)
    assert labels.label("qwen3-coder-30b") == "qwen3-coder-30b"
    assert labels.label("gpt-4o-mini") == "gpt-4o"  # the table still comes first
    assert labels.label("what a client typed") == "other"
    assert labels.label("x" * 200) == "x" * MODEL_LABEL_MAX_CHARS


def test_a_model_discovered_after_its_first_request_gets_its_label_then() -> None:
    reported: set[str] = set()
    labels = ModelLabels(table, discovered=lambda m: m in reported)
    assert labels.label("late-model") == "other"
    reported.add("late-model")  # discovery answered after the first request
    assert labels.label("late-model") == "late-model"


def test_discovered_names_share_the_cap_with_every_other_label() -> None:
    labels = ModelLabels(table, discovered=lambda m: True, max_labels=20)
    names = [f"served-{i}" for i in range(100)]
    seen = {labels.label(name) for name in names}
    assert len(seen) == 21 and "other" in seen
    assert len({labels.label(name) for name in names}) == 21  # stable once capped


def test_a_failing_discovered_lookup_gives_other() -> None:
    def broken(model: str) -> Any:
        raise RuntimeError(model)

    assert ModelLabels(table, discovered=broken).label("served") == "other"


def test_route_labels_come_from_the_recorded_api_and_the_own_endpoints() -> None:
    routes = RouteLabels(counting={"/v1/messages/count_tokens"})
    assert routes.after("/v1/chat/completions", "chat") == "chat"
    assert routes.after("/v1beta/models/g:generateContent", "gemini") == "gemini"  # no table of paths
    assert routes.after("/v1/messages/count_tokens", "messages") == "count"
    assert routes.after("/v1/context/plan", "responses") == "plan"  # the dry run records its API too
    # The gateway engine's endpoints are the engine's, whatever API the body is in.
    assert routes.after("/v1/compress", "messages") == routes.before("/v1/compress") == "engine"
    assert routes.after("/v1/context/compact/v1/responses", "responses") == "engine"
    assert routes.after("/v1/context/compact/v1beta/models/g:generateContent", "gemini") == "engine"
    assert not RouteLabels.fitted(routes.after("/v1/compress", "chat"), "chat")
    assert routes.after("/v1/embeddings", None) == "passthrough"
    # The proxy's model report is its own endpoint, not traffic passed through.
    assert routes.after("/v1/context/models", None) == routes.before("/v1/context/models") == "models"
    assert routes.after("/readyz", None) == "health"
    assert routes.after("/metrics", None) == routes.after("/", None) == "observability"
    assert routes.after("/wp-admin/" + "x" * 50, None) == "other"
    assert routes.before("/v1/chat/completions") == "passthrough"  # until the route ran
    assert RouteLabels.fitted("chat", "chat") and not RouteLabels.fitted("count", "messages")
    assert not RouteLabels.fitted("passthrough", None)


def test_proxied_paths_are_every_api_version_prefix() -> None:
    assert proxied("/v1/chat/completions") and proxied("/v1beta/models/g:generateContent")
    assert proxied("/v1/context/models") and proxied("/v1/context/plan")
    assert not proxied("/") and not proxied("/metrics") and not proxied("/healthz")


def test_api_labels_pass_registered_names_and_cap_the_rest() -> None:
    apis = ApiLabels(["chat", "responses", "messages"])
    assert apis.names == ("chat", "responses", "messages")
    assert apis("messages") == "messages" and apis(None) == "none" and apis("") == "none"
    assert apis("Toy API!") == "toy_api"
    seen = {apis(f"unregistered {i}") for i in range(100)}
    assert len(seen) == MAX_TOKEN_VALUES and "other" in seen


def test_token_sets_are_sanitized_and_capped() -> None:
    tokens = TokenSet(cap=3)
    assert tokens("/v1/Models") == "v1_models" and tokens("") == "other"
    assert [tokens(x) for x in ("a", "b", "c")] == ["a", "b", "other"]


def test_upstream_labels_are_the_configured_base_urls_without_credentials() -> None:
    labels = UpstreamLabels(
        ["http://user:pw@main.test:8000/v1", "https://llama.test/v1", "https://llama.test/v1/big", ""]
    )
    assert labels.labels == ("http://main.test:8000/v1", "https://llama.test/v1", "https://llama.test/v1/big")
    assert labels("http://user:pw@main.test:8000/v1/chat/completions") == "http://main.test:8000/v1"
    assert labels("https://llama.test/v1/big/messages") == "https://llama.test/v1/big"  # longest prefix
    assert labels("https://llama.test/v1/messages") == "https://llama.test/v1"
    # A client's own versioned path at the base URL's origin is that upstream.
    assert labels("http://user:pw@main.test:8000/v1beta/models/g:generateContent") == "http://main.test:8000/v1"
    assert labels("https://elsewhere.test/v1/chat/completions") == "other"
    assert labels("http://main.test:8000/v1x") == "http://main.test:8000/v1"  # same origin, not the prefix
    assert labels("") == "other" and labels("not a url") == "other"
    assert MAX_MODEL_LABELS >= 1


def test_retry_outcomes() -> None:
    assert retry_outcomes(0, 200) == []
    assert retry_outcomes(1, 200) == ["succeeded"]
    assert retry_outcomes(2, 400) == ["overflowed_again", "failed"]
    assert retry_outcomes(1, None) == ["failed"]
    assert status_class(None) == "error" and status_class(503) == "5xx"


def test_display_url_drops_credentials_query_and_fragment() -> None:
    assert display_url("https://k:s@h.test:8443/v1?key=s#f") == "https://h.test:8443/v1"
    assert display_url("http://[::1]:8080/v1") == "http://[::1]:8080/v1"
    assert display_url("http://a b:99999/") == "(invalid URL)"


def test_the_engine_label_covers_the_paths_the_api_layer_serves() -> None:
    from app.api.compress import COMPACT_PREFIX, COMPRESS_PATH, compact_path
    from app.core.dialects import DIALECTS

    routes = RouteLabels()
    assert routes.after(COMPRESS_PATH, "chat") == "engine"
    for dialect in DIALECTS.values():
        assert compact_path(dialect).startswith(COMPACT_PREFIX + "/")
        assert routes.after(compact_path(dialect), dialect.name) == "engine"


def test_route_labels_of_apis_are_remembered_and_bounded() -> None:
    from app.observability import labels

    routes = RouteLabels(counting={"/v1/messages/count_tokens"})
    assert routes.after("/v1/messages/count_tokens", "messages") == "count"
    assert routes.after("/v1/messages/count_tokens", "messages") == "count"  # from the memo
    assert routes.after("/v1/compress", "chat") == "engine" and routes.after("/v1/x", None) == "passthrough"
    for i in range(labels.MAX_ROUTE_MEMO + 5):
        assert routes.after(f"/v1beta/models/m{i}:generateContent", "gemini") == "gemini"
    assert len(routes._memo) <= labels.MAX_ROUTE_MEMO
