"""Builders of Gemini bodies for the dialect's tests, and the pipeline driven through it.

Signed parts are signed by the strict fake upstream's own ``Signer`` (``SIGNER``, model ``MODEL``),
so its ``check_structure`` is an independent oracle for what the dialect renders.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from app.core.budget import Policy
from app.core.dialects.gemini import GEMINI, parse_gemini
from app.core.fit import plan_request
from app.core.plan import Plan
from app.core.registry import ModelSpec
from app.core.tokens import MessageCounter
from tests.fake_gemini_upstream import FakeGeminiModel, Signer, check_structure

MODEL = "gemini-test"
SIGNER = Signer(b"gemini-test-secret")
FAKE_MODEL = FakeGeminiModel(MODEL)
PNG_DATA = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def user(*texts: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"text": t} for t in texts]}


def said(text: str, *, signed: bool = False) -> dict[str, Any]:
    part: dict[str, Any] = {"text": text}
    if signed:
        part["thoughtSignature"] = SIGNER.sign(MODEL, part)
    return {"role": "model", "parts": [part]}


def call_part(
    name: str, args: dict[str, Any], *, call_id: str | None = None, signed: bool = True
) -> dict[str, Any]:
    call: dict[str, Any] = {"name": name, "args": args}
    if call_id is not None:
        call["id"] = call_id
    part: dict[str, Any] = {"functionCall": call}
    if signed:
        part["thoughtSignature"] = SIGNER.sign(MODEL, part)
    return part


def thought(text: str) -> dict[str, Any]:
    part = {"text": text, "thought": True}
    return {**part, "thoughtSignature": SIGNER.sign(MODEL, part)}


def result_part(name: str, output: str, *, call_id: str | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {"name": name, "response": {"output": output}}
    if call_id is not None:
        response["id"] = call_id
    return {"functionResponse": response}


def step(
    names: Sequence[str], outputs: Sequence[str], *, tag: str, ids: bool = True, think: bool = False
) -> list[dict[str, Any]]:
    """One model step: parallel calls (the first signed, as Gemini signs a step) and their results."""
    calls = [
        call_part(name, {"n": f"{tag}.{j}"}, call_id=f"{tag}.{j}" if ids else None, signed=j == 0)
        for j, name in enumerate(names)
    ]
    results = [
        result_part(name, out, call_id=f"{tag}.{j}" if ids else None)
        for j, (name, out) in enumerate(zip(names, outputs, strict=True))
    ]
    model_parts = ([thought(f"thinking about {tag}")] if think else []) + calls
    return [{"role": "model", "parts": model_parts}, {"role": "user", "parts": results}]


def body(contents: Sequence[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"contents": list(contents), **extra}


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def spec(window_tokens: int = 1_000_000) -> ModelSpec:
    return ModelSpec(name=MODEL, window_tokens=window_tokens, max_output_tokens=8192, encoding="estimate")


def fit(
    request: dict[str, Any],
    *,
    counter: MessageCounter,
    cap_tokens: int | None = None,
    window_tokens: int = 1_000_000,
    policy: Policy | None = None,
) -> tuple[Plan, dict[str, Any]]:
    """Plan ``request`` through the Gemini dialect as the service will; the plan and the body it
    would forward."""
    plan = plan_request(
        request,
        spec=spec(window_tokens),
        policy=policy or Policy(),
        counter=counter,
        cap_tokens=cap_tokens,
        dialect=GEMINI,
        conversation=parse_gemini(request, model=MODEL, stream=False),
    )
    return plan, (plan.body(request) if plan.changed else request)


def strict_check(request: dict[str, Any]) -> None:
    """The fake upstream's own structural and signature rules (raises ``Refused``)."""
    check_structure(request, FAKE_MODEL, SIGNER)
