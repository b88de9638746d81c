"""Property tests of the pipeline through the Gemini dialect over generated sessions (parallel calls
paired by id or by name, signed steps and thoughts, images, notes), checked by the strict fake
upstream's own rules (alternation, pairing, HMAC-signed thought signatures)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core.budget import Policy
from app.core.dialects.gemini import GEMINI, parse_gemini
from app.core.errors import InvalidRequest
from tests.core.dialects.gemini_kit import (
    MODEL,
    PNG_DATA,
    SIGNER,
    call_part,
    dumps,
    fit,
    result_part,
    thought,
)
from tests.core.fakes import FakeMessageCounter
from tests.fake_gemini_upstream import FakeGeminiModel, check_structure

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LENIENT = FakeGeminiModel(MODEL, requires_signatures=False, parts_after_responses=True)
STRICT = FakeGeminiModel(MODEL)


@st.composite
def texts(draw: st.DrawFn) -> str:
    n = draw(st.integers(0, 150))
    tag = draw(st.sampled_from(["w", "x", "汉"]))
    return " ".join(f"{tag}{i}" for i in range(n))


@st.composite
def user_parts(draw: st.DrawFn) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"text": draw(texts())}]
    if draw(st.integers(0, 4)) == 0:
        parts.append({"inlineData": {"mimeType": "image/png", "data": PNG_DATA}})
    if draw(st.integers(0, 3)) == 0:
        parts.append({"text": draw(texts())})
    return parts


@st.composite
def model_step(draw: st.DrawFn, tag: str, signed: bool) -> list[dict[str, Any]]:
    """A text reply, or parallel calls (the first signed in a signed session) and their results."""
    if draw(st.integers(0, 3)) == 0:
        part: dict[str, Any] = {"text": draw(texts())}
        if signed and draw(st.booleans()):
            part["thoughtSignature"] = SIGNER.sign(MODEL, part)
        return [{"role": "model", "parts": [part]}]
    names = draw(st.lists(st.sampled_from(["read_file", "grep", "run"]), min_size=1, max_size=3))
    ids = draw(st.booleans())
    calls = [
        call_part(name, {"n": f"{tag}.{j}"}, call_id=f"{tag}.{j}" if ids else None, signed=signed and j == 0)
        for j, name in enumerate(names)
    ]
    results = [
        result_part(name, draw(texts()), call_id=f"{tag}.{j}" if ids else None)
        for j, name in enumerate(names)
    ]
    if ids:
        results = draw(st.permutations(results))
    thinking = [thought(f"thinking {tag}")] if signed and draw(st.integers(0, 3)) == 0 else []
    return [{"role": "model", "parts": thinking + calls}, {"role": "user", "parts": results}]


@st.composite
def sessions(draw: st.DrawFn) -> tuple[dict[str, Any], bool]:
    """A valid body (alternating, paired, signed when ``signed``) and whether it is signed."""
    signed = draw(st.booleans())
    contents: list[dict[str, Any]] = []
    for t in range(draw(st.integers(1, 7))):
        parts = draw(user_parts())
        if contents and contents[-1]["role"] == "user":
            # As gemini-cli coalesces (after the function responses: Gemini 2.5 takes it), or text
            # first, as a client that knows Gemini 3's rule does.
            both = parts + contents[-1]["parts"] if signed else contents[-1]["parts"] + parts
            contents[-1] = {"role": "user", "parts": both}
        else:
            contents.append({"role": "user", "parts": parts})
        for s in range(draw(st.integers(0, 4))):
            step = draw(model_step(f"{t}_{s}", signed))
            if contents[-1]["role"] == "model":
                break  # a text reply ends the turn
            contents += step
    body: dict[str, Any] = {"contents": contents}
    if draw(st.booleans()):
        body["systemInstruction"] = {"parts": [{"text": draw(texts())}]}
    if draw(st.booleans()):
        body["tools"] = [{"functionDeclarations": [{"name": n} for n in ("read_file", "grep", "run")]}]
    if draw(st.booleans()):
        body["generationConfig"] = {"maxOutputTokens": draw(st.integers(1, 5000))}
    return body, signed


policies = st.builds(
    Policy,
    keep_turns=st.integers(0, 3),
    pin_first_user=st.booleans(),
    prune_minimum_tokens=st.sampled_from([1, 20_000]),
    prune_protect_tool_tokens=st.sampled_from([0, 40_000]),
    drop_block_tokens=st.sampled_from([None, 150, 800]),
    protect_max_share=st.sampled_from([0.25, 0.5, 1.0]),
)


def signed_parts(body: dict[str, Any]) -> set[str]:
    return {
        dumps(p) for c in body["contents"] for p in c["parts"] if "thoughtSignature" in p or p.get("thought")
    }


@SETTINGS
@given(session=sessions(), cap=st.integers(60, 4000), policy=policies)
def test_fitting_keeps_every_rule_and_every_signature(
    session: tuple[dict[str, Any], bool], cap: int, policy: Policy
) -> None:
    request, signed = session
    model = STRICT if signed else LENIENT
    check_structure(request, model, SIGNER)  # the generator makes valid sessions
    counter = FakeMessageCounter()
    pristine = copy.deepcopy(request)
    plan, forwarded = fit(request, counter=counter, cap_tokens=cap, policy=policy)
    assert request == pristine  # never mutated

    # An unsigned session may hold parts after a content's function responses (gemini-cli's
    # coalescing): the input's own, never one the engine adds.
    allowed = [] if signed else ["a part follows the function responses of a content"]
    assert set(GEMINI.problems(forwarded)) <= set(GEMINI.problems(request)) <= set(allowed)
    check_structure(forwarded, model, SIGNER)  # alternation, first user, pairing, every signature
    # a signed part is never edited, and a content holding one is the client's own content object
    assert signed_parts(forwarded) <= signed_parts(request)
    originals = [id(c) for c in request["contents"]]
    for content in forwarded["contents"]:
        if any("thoughtSignature" in p or p.get("thought") for p in content["parts"]):
            assert id(content) in originals
    if not plan.changed:
        assert forwarded is request  # the same bytes go upstream
    else:  # rendering without the parse's identities gives the same body
        assert GEMINI.render(request, plan.messages) == forwarded
    if plan.fits:
        recount = sum(counter.count_messages(parse_gemini(forwarded, model=MODEL, stream=False).messages)) + 3
        assert recount <= plan.budget.input_budget_tokens
        again, twice = fit(forwarded, counter=counter, cap_tokens=cap, policy=policy)
        assert not again.changed and twice is forwarded  # idempotent


@SETTINGS
@given(session=sessions())
def test_an_unchanged_parse_renders_the_same_body(session: tuple[dict[str, Any], bool]) -> None:
    request, _ = session
    messages = parse_gemini(request, model=MODEL, stream=False).messages
    assert GEMINI.render(request, messages) == request
    assert GEMINI.render(request, messages, source=messages) == request
    plan, forwarded = fit(request, counter=FakeMessageCounter(), cap_tokens=10_000_000)
    assert not plan.changed and forwarded is request


json_leaf = st.none() | st.booleans() | st.integers(-5, 10**6) | st.text(max_size=12)
json_any = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
odd_part = st.one_of(
    json_any,
    st.fixed_dictionaries(
        {},
        optional={
            "text": json_any,
            "thought": json_any,
            "thoughtSignature": json_any,
            "functionCall": st.fixed_dictionaries(
                {"name": st.sampled_from(["f", "g"]) | json_any}, optional={"args": json_any, "id": json_any}
            ),
            "functionResponse": st.fixed_dictionaries(
                {"name": st.sampled_from(["f", "g"]) | json_any},
                optional={"response": json_any, "id": json_any},
            ),
            "inlineData": json_any,
        },
    ),
)
odd_content = st.one_of(
    json_any,
    st.fixed_dictionaries(
        {},
        optional={
            "role": st.sampled_from(["user", "model", "tool"]) | json_any,
            "parts": st.lists(odd_part, max_size=4) | json_any,
        },
    ),
)
odd_bodies = st.fixed_dictionaries(
    {},
    optional={
        "contents": st.lists(odd_content, max_size=6) | json_any,
        "systemInstruction": json_any | st.fixed_dictionaries({"parts": st.lists(odd_part, max_size=2)}),
        "generationConfig": json_any,
        "tools": json_any,
        "cachedContent": json_any,
    },
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=odd_bodies, cap=st.integers(30, 400))
def test_any_json_is_planned_or_refused_as_an_invalid_request(request: dict[str, Any], cap: int) -> None:
    """Whatever the body, the dialect and the pipeline either plan it or raise ``InvalidRequest``
    (a 400), never anything else; what they accept renders back to itself."""
    counter = FakeMessageCounter()
    try:
        conversation = parse_gemini(request, model=MODEL, stream=False)
    except InvalidRequest:
        return
    assert GEMINI.render(request, conversation.messages) == request
    GEMINI.problems(request)
    GEMINI.tool_tokens(request, counter)
    try:
        plan, forwarded = fit(request, counter=counter, cap_tokens=cap)
    except InvalidRequest:
        return
    assert set(GEMINI.problems(forwarded)) <= set(GEMINI.problems(request))
    assert plan.changed or forwarded is request
