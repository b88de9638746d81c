import json

import pytest

from app.wire import dump_document, dump_json, finite


def test_plain_data_is_compact_json() -> None:
    assert dump_json({"a": [1, "é"]}) == '{"a":[1,"é"]}'.encode()


def test_a_lone_surrogate_survives_as_an_escape() -> None:
    raw = dump_json({"messages": [{"role": "user", "content": "x\ud800y"}]})
    assert b"\\ud800" in raw
    assert json.loads(raw)["messages"][0]["content"] == "x\ud800y"


def test_no_writer_writes_nan_or_infinity() -> None:
    for value in (float("nan"), float("inf"), float("-inf")):
        # The fallback (a lone surrogate sends a body there) refuses, never writes the token.
        with pytest.raises(ValueError):
            dump_json({"content": "x\ud800y", "temperature": value})
        # The proxy's own documents are checked: a non-finite figure is a bug, never a null.
        with pytest.raises(ValueError):
            dump_document({"figures": [{"share": value}]})
        assert not finite({"a": ({"b": [1, value]},)})


def test_a_document_of_finite_figures_is_written_as_dump_json_writes_it() -> None:
    document = {"share": 0.5, "tokens": 10, "nested": [{"ratio": 1e308}], "none": None, "text": "x"}
    assert finite(document)
    assert dump_document(document) == dump_json(document)
