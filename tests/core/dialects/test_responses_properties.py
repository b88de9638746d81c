"""Property tests of the pipeline through the Responses dialect over generated agent sessions
(reasoning items, parallel and custom calls, built-in calls, compaction, images, notes)."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core.budget import Policy
from app.core.dialects.responses import RESPONSES
from app.core.errors import InvalidRequest
from tests.core.dialects.responses_kit import body, call, dumps, fit, output, reasoning, said, user
from tests.core.fakes import FakeMessageCounter

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Items the engine must never edit: byte-identical in the output or absent.
SEALED = frozenset(
    {"reasoning", "compaction", "web_search_call", "computer_call", "computer_call_output", "item_reference"}
)


@st.composite
def texts(draw: st.DrawFn) -> str:
    n = draw(st.integers(0, 150))
    tag = draw(st.sampled_from(["w", "x", "汉"]))
    return " ".join(f"{tag}{i}" for i in range(n))


@st.composite
def user_item(draw: st.DrawFn) -> dict[str, Any]:
    text = draw(texts())
    shape = draw(st.integers(0, 5))
    if shape == 0:
        return {"role": "user", "content": text}
    if shape == 1:
        return {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": text},
                {"type": "input_image", "image_url": "https://example.test/i.png", "detail": "low"},
            ],
        }
    return user(text)


@st.composite
def step(draw: st.DrawFn, tag: str) -> list[dict[str, Any]]:
    """One model step: optional reasoning, then a reply, parallel calls with outputs, or a built-in."""
    out: list[dict[str, Any]] = []
    if draw(st.booleans()):
        out.append(reasoning(f"rs_{tag}", secret_chars=draw(st.integers(8, 800))))
    kind = draw(st.integers(0, 5))
    if kind == 0:
        out.append(said(draw(texts()), item_id=f"msg_{tag}"))
    elif kind == 1:
        out += [
            {"type": "web_search_call", "id": f"ws_{tag}", "status": "completed", "action": {"query": "q"}},
            said(draw(texts()), item_id=f"msg_{tag}"),
        ]
    elif kind == 2:
        out += [
            {"type": "computer_call", "id": f"cu_{tag}", "call_id": f"k_{tag}", "action": {"type": "wait"}},
            {
                "type": "computer_call_output",
                "call_id": f"k_{tag}",
                "output": {"type": "input_image", "image_url": "u"},
            },
        ]
    elif kind == 3:
        out += [
            {
                "type": "custom_tool_call",
                "id": f"ct_{tag}",
                "call_id": f"p_{tag}",
                "name": "apply_patch",
                "input": draw(texts()),
            },
            {"type": "custom_tool_call_output", "call_id": f"p_{tag}", "output": draw(texts())},
        ]
    else:
        ids = [f"c_{tag}_{j}" for j in range(draw(st.integers(1, 3)))]
        out += [call(i, args=json.dumps({"cmd": i})) for i in ids]
        outputs = [output(i, draw(texts())) for i in ids]
        out += draw(st.permutations(outputs))
    return out


@st.composite
def sessions(draw: st.DrawFn) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    if draw(st.integers(0, 3)) == 0:
        items.append(
            {"type": "compaction", "id": "cmp_0", "encrypted_content": "e" * draw(st.integers(4, 400))}
        )
    if draw(st.booleans()):
        items.append({"role": "developer", "content": draw(texts())})
    for t in range(draw(st.integers(1, 8))):
        items.append(draw(user_item()))
        for s in range(draw(st.integers(0, 4))):
            items += draw(step(f"{t}_{s}"))
    extra: dict[str, Any] = {}
    if draw(st.booleans()):
        extra["instructions"] = draw(texts())
    return body(items, **extra)


policies = st.builds(
    Policy,
    keep_turns=st.integers(0, 3),
    pin_first_user=st.booleans(),
    prune_minimum_tokens=st.sampled_from([1, 20_000]),
    prune_protect_tool_tokens=st.sampled_from([0, 40_000]),
    drop_block_tokens=st.sampled_from([None, 150, 800]),
    protect_max_share=st.sampled_from([0.25, 0.5, 1.0]),
)


def _follower(items: list[dict[str, Any]], k: int) -> str | None:
    return dumps(items[k + 1]) if k + 1 < len(items) else None


@SETTINGS
@given(request=sessions(), cap=st.integers(60, 4000), policy=policies)
def test_fitting_through_the_responses_dialect(request: dict[str, Any], cap: int, policy: Policy) -> None:
    counter = FakeMessageCounter()
    pristine = copy.deepcopy(request)
    plan, forwarded = fit(request, cap_tokens=cap, counter=counter, policy=policy)
    assert request == pristine  # never mutated

    # never a lost pair, never a reasoning item without the item it led to
    assert RESPONSES.problems(forwarded) == RESPONSES.problems(request) == []

    # sealed items are byte-identical or absent, and a kept reasoning item keeps its follower
    originals = request["input"]
    followers = {dumps(item): _follower(originals, k) for k, item in enumerate(originals)}
    out = forwarded["input"]
    for k, item in enumerate(out):
        if item.get("type") in SEALED:
            assert dumps(item) in followers
        if item.get("type") == "reasoning":
            assert _follower(out, k) == followers[dumps(item)]
    # a changed item keeps every key but its text
    by_key = {(i.get("type"), i.get("id"), i.get("call_id")): i for i in originals}
    for item in out:
        source = by_key.get((item.get("type"), item.get("id"), item.get("call_id")))
        if source is not None and item.get("type") != "message":
            assert set(item) == set(source)
    assert forwarded.get("instructions") is not None or "instructions" not in request

    if not plan.changed:
        assert forwarded is request  # the same bytes go upstream
    else:  # the plan renders from its parse: the same body as rendering after a fresh parse
        assert RESPONSES.render(request, plan.messages) == forwarded
    if plan.fits:
        recount = sum(counter.count_messages(RESPONSES.parse(forwarded).messages)) + 3
        assert recount <= plan.budget.input_budget_tokens
        again, twice = fit(forwarded, cap_tokens=cap, counter=counter, policy=policy)
        assert not again.changed and twice is forwarded  # idempotent


@SETTINGS
@given(request=sessions())
def test_a_session_that_fits_is_unchanged(request: dict[str, Any]) -> None:
    plan, forwarded = fit(request, cap_tokens=10_000_000, counter=FakeMessageCounter())
    assert not plan.changed and plan.fits and forwarded is request
    assert RESPONSES.render(request, RESPONSES.parse(request).messages) == request


@SETTINGS
@given(request=sessions(), cap=st.integers(200, 3000))
def test_fits_when_the_pinned_items_and_the_newest_turn_fit_with_room(
    request: dict[str, Any], cap: int
) -> None:
    """With the default policy, a session fits when what may never be dropped (instructions,
    developer/compaction items, the first and the newest user turn) takes at most a third of the
    budget: everything else can be dropped whole."""
    counter = FakeMessageCounter()
    messages = RESPONSES.parse(request).messages
    counts = counter.count_messages(messages)
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    first_turn_stop = users[1] if len(users) > 1 else len(messages)
    essential = sum(
        counts[i]
        for i, m in enumerate(messages)
        if m["role"] in ("system", "developer") or i >= users[-1] or users[0] <= i < first_turn_stop
    )
    plan, _ = fit(request, cap_tokens=cap, counter=counter)
    if essential * 3 <= plan.budget.input_budget_tokens:
        assert plan.fits


json_leaf = st.none() | st.booleans() | st.integers(-5, 10**6) | st.text(max_size=20)
json_any = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
odd_item = st.one_of(
    json_any,
    st.fixed_dictionaries(
        {"type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning", "zzz"])},
        optional={
            "role": st.sampled_from(["user", "assistant", "tool", "bot"]) | json_any,
            "content": json_any | st.lists(json_any, max_size=2),
            "call_id": st.sampled_from(["c1", "c2"]) | json_any,
            "output": json_any,
            "id": json_any,
            "encrypted_content": json_any,
            "summary": json_any,
        },
    ),
    st.fixed_dictionaries({"role": json_any}, optional={"content": json_any}),
)
odd_bodies = st.fixed_dictionaries(
    {"model": st.just("test-model")},
    optional={
        "input": json_any | st.lists(odd_item, max_size=6),
        "instructions": json_any,
        "max_output_tokens": json_any,
        "tools": json_any,
        "text": json_any,
    },
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=odd_bodies, cap=st.integers(30, 400))
def test_any_json_is_planned_or_refused_as_an_invalid_request(request: dict[str, Any], cap: int) -> None:
    """Whatever the body, the dialect and the pipeline either plan it or raise ``InvalidRequest``
    (a 400), never anything else; what they accept renders back to itself and fits idempotently."""
    counter = FakeMessageCounter()
    try:
        conversation = RESPONSES.parse(request)
    except InvalidRequest:
        return
    assert RESPONSES.render(request, conversation.messages) == request
    RESPONSES.problems(request)
    RESPONSES.tool_tokens(request, counter)
    try:
        plan, forwarded = fit(request, cap_tokens=cap, counter=counter)
    except InvalidRequest:
        return
    assert set(RESPONSES.problems(forwarded)) <= set(RESPONSES.problems(request))
    assert plan.changed or forwarded is request
