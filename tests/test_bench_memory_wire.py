"""bench/memory_wire.py: the memory benchmark's sessions in Gemini's shape pass the strict fake's own
rules (alternation, pairing, every signature verified), a follow-up text before the responses."""

from __future__ import annotations

import random

from bench.memory import GEMINI_SIGNER, SHAPES, agent_session, chat_session
from bench.memory_wire import as_gemini
from tests.fake_gemini_upstream import FakeGeminiModel, check_structure

STRICT = FakeGeminiModel("bench-x")


def test_an_agent_session_as_gemini_is_valid_and_signed() -> None:
    *_, history = agent_session(random.Random(3), SHAPES["agent-8k"])
    body = as_gemini(history, model="bench-x", max_tokens=1024, signer=GEMINI_SIGNER)
    check_structure(body, STRICT, GEMINI_SIGNER)  # raises Refused on any broken rule
    models = [c for c in body["contents"] if c["role"] == "model"]
    assert models and all(any("thoughtSignature" in p for p in c["parts"]) for c in models)
    # Follow-ups after tool results join the results' content, before them (Gemini 3 refuses after).
    mixed = [c["parts"] for c in body["contents"] if c["role"] == "user" and len(c["parts"]) > 1]
    follow_ups = [p for p in mixed if "text" in p[0]]
    assert follow_ups and all("functionResponse" in p[-1] for p in follow_ups)
    assert body["generationConfig"] == {"maxOutputTokens": 1024}


def test_a_chat_session_as_gemini_signs_each_answer() -> None:
    *_, history = chat_session(random.Random(4), SHAPES["chat-8k"])
    body = as_gemini(history, model="bench-x", max_tokens=512, signer=GEMINI_SIGNER)
    check_structure(body, STRICT, GEMINI_SIGNER)
    answers = [c for c in body["contents"] if c["role"] == "model"]
    assert answers and all("thoughtSignature" in c["parts"][-1] for c in answers)
    assert body["systemInstruction"]["parts"][0]["text"].startswith("You are a helpful assistant.")
