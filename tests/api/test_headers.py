from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from app.api.headers import parse_context_headers
from app.core.errors import InvalidRequest
from app.service.request import RequestOptions


def test_absent_headers_give_empty_options() -> None:
    assert parse_context_headers(Headers({"content-type": "application/json"})) == RequestOptions()


def test_every_header_is_parsed_case_insensitively() -> None:
    headers = Headers(
        {
            "x-context-budget": "5000",
            "X-CONTEXT-RESERVE": "0",
            "X-Context-Window": " 8192 ",
            "x-context-policy": "Truncate",
            "x-context-keep-turns": "0",
            "x-context-cut-target": " 0.75 ",
        }
    )
    assert parse_context_headers(headers) == RequestOptions(
        budget_tokens=5000,
        reserve_tokens=0,
        window_tokens=8192,
        mode="truncate",
        keep_turns=0,
        cut_target=0.75,
    )
    assert parse_context_headers(Headers({"X-Context-Cut-Target": "1"})).cut_target == 1.0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("X-Context-Budget", ""),
        ("X-Context-Budget", "1_000"),
        ("X-Context-Budget", "1\u00b2"),
        ("X-Context-Budget", "9" * 20),
        ("X-Context-Window", "-1"),
        ("X-Context-Reserve", "lots"),
        ("X-Context-Policy", ""),
        ("X-Context-Keep-Turns", "1.0"),
        ("X-Context-Cut-Target", "0"),
        ("X-Context-Cut-Target", "1.5"),
        ("X-Context-Cut-Target", "-0.5"),
        ("X-Context-Cut-Target", "nan"),
        ("X-Context-Cut-Target", "6e-1"),
        ("X-Context-Upstream-Count", "no"),
        ("X-Context-Lower-Output", "1"),
        ("X-Context-Summarize", "yes"),
    ],
)
def test_bad_values_raise_invalid_request_naming_the_header(name: str, value: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_context_headers(Headers({name: value}))
    assert info.value.param == name
    assert name in info.value.message


def test_the_boundary_switches_are_on_or_off() -> None:
    headers = Headers({"x-context-upstream-count": "OFF", "X-Context-Lower-Output": " on "})
    options = parse_context_headers(headers)
    assert options.upstream_count is False and options.lower_output is True
    assert parse_context_headers(Headers({"X-Context-Summarize": "on"})).summarize is True


def test_options_of_raw_pairs_match_the_parse_of_the_same_headers() -> None:
    from app.api.headers import NO_OPTIONS, options_of

    plain = [(b"content-type", b"application/json"), (b"x-request-id", b"r1")]
    assert options_of(plain) is NO_OPTIONS and RequestOptions() == NO_OPTIONS
    ours = [
        *plain,
        (b"X-Context-Budget", b"5000"),
        (b"x-context-policy", b"off"),
        (b"x-context-budget", b"7"),
    ]
    # Case-insensitive, the first of a repeated header wins (as Starlette's Headers.get).
    assert options_of(ours) == parse_context_headers(Headers(raw=[(k.lower(), v) for k, v in ours]))
    assert options_of(ours).budget_tokens == 5000 and options_of(ours).mode == "off"
    with pytest.raises(InvalidRequest):
        options_of([(b"x-context-window", b"lots")])
