"""The exchange's decisions, scripted event by event: no HTTP, no planning, only values."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest

from app.core.budget import Budget, Policy, PolicyMode
from app.core.dialects import CHAT, DIALECTS
from app.core.exchange import Deliver, Exchange, ExchangeStateError, Fail, Replan, Send
from app.core.plan import Plan
from app.core.retry import MAX_RETRIES
from tests.core.fakes import SPEC

BUDGET = Budget(window_tokens=10_000, reserve_tokens=1_000, margin_tokens=100, tool_tokens=0)


def plan(tokens: int, *, fits: bool = True, changed: bool = False) -> Plan:
    return Plan(
        model="m",
        spec=SPEC,
        budget=BUDGET,
        count_kind="exact",
        tokens_before=tokens,
        tokens_after=tokens,
        changed=changed,
        fits=fits,
        messages=(),
        message_tokens=(),
        dialect=CHAT,
    )


def overflow_body(limit: int, prompt: int) -> bytes:
    message = (
        f"This model's maximum context length is {limit} tokens. However, your messages resulted in "
        f"{prompt} tokens. Please reduce the length of the messages."
    )
    error: dict[str, Any] = {
        "message": message,
        "type": "invalid_request_error",
        "code": "context_length_exceeded",
    }
    return json.dumps({"error": error}).encode()


def exchange(mode: PolicyMode = "auto") -> Exchange:
    return Exchange(dialect=CHAT, mode=mode)


def test_a_success_is_delivered_without_reading_its_body() -> None:
    ex = exchange()
    first = plan(500)
    assert ex.start(first) == Send(first)
    assert not ex.reads_answer(200)
    assert ex.answered(200, None) == Deliver()
    assert ex.retries == 0 and ex.plan is first and ex.state == "done"


def test_a_plan_that_does_not_fit_fails_unless_the_policy_is_off() -> None:
    over = plan(20_000, fits=False)
    command = exchange().start(over)
    assert isinstance(command, Fail) and command.plan is over and "does not bring it under" in command.reason
    rejected = exchange("reject").start(over)
    assert isinstance(rejected, Fail) and "'reject'" in rejected.reason
    assert exchange("off").start(over) == Send(over)


@pytest.mark.parametrize(("tool_tokens", "words"), [(9_500, "exceed"), (8_900, "use up")])
def test_tool_definitions_alone_over_the_budget_are_named_not_the_conversation(
    tool_tokens: int, words: str
) -> None:
    budget = Budget(window_tokens=10_000, reserve_tokens=1_000, margin_tokens=100, tool_tokens=tool_tokens)
    over = replace(plan(tool_tokens + 50, fits=False), budget=budget)
    for mode in ("auto", "reject"):
        command = exchange(mode).start(over)
        assert isinstance(command, Fail)
        assert f"the tool definitions alone ({tool_tokens} tokens) {words} the input budget" in command.reason
        assert "shortening the conversation cannot help" in command.reason
    capped = Budget(
        window_tokens=10_000, reserve_tokens=1_000, margin_tokens=100, tool_tokens=600, cap_tokens=500
    )
    command = exchange().start(replace(plan(700, fits=False), budget=capped))
    assert isinstance(command, Fail) and "(600 tokens) exceed" in command.reason
    # Tools that leave room: the conversation is what is too long.
    roomy = Budget(window_tokens=10_000, reserve_tokens=1_000, margin_tokens=100, tool_tokens=2_000)
    command = exchange().start(replace(plan(20_000, fits=False), budget=roomy))
    assert isinstance(command, Fail) and "does not bring it under" in command.reason


def test_an_overflow_is_replanned_under_a_smaller_cap_and_resent() -> None:
    ex = exchange()
    ex.start(plan(9_000))
    assert ex.reads_answer(400)
    command = ex.answered(400, overflow_body(8_000, 9_500))
    assert isinstance(command, Replan) and command.cap_tokens < 9_000
    assert command.overflow.limit_tokens == 8_000 and command.overflow.prompt_tokens == 9_500
    smaller = plan(6_000, changed=True)
    assert ex.replanned(smaller) == Send(smaller)
    assert ex.retries == 1 and ex.plan is smaller
    assert ex.answered(200, None) == Deliver() and ex.retries == 1


@pytest.mark.parametrize(
    "retry",
    [
        plan(9_000, changed=True),  # not smaller than what was refused
        plan(9_500, changed=True),
        plan(6_000, changed=False),  # changed nothing (policy off, reject)
        plan(6_000, changed=True, fits=False),
    ],
)
def test_a_retry_that_cannot_help_is_not_sent(retry: Plan) -> None:
    ex = exchange()
    ex.start(plan(9_000))
    assert isinstance(ex.answered(400, overflow_body(8_000, 9_500)), Replan)
    # The refused answer goes back as is; its overflow was already reported with the Replan.
    assert ex.replanned(retry) == Deliver() and ex.retries == 0


def test_other_errors_are_delivered_and_an_overflow_without_room_carries_its_numbers() -> None:
    ex = exchange()
    ex.start(plan(9_000))
    rate_limit = json.dumps({"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}})
    assert ex.answered(429, rate_limit.encode()) == Deliver()
    ex = exchange()
    ex.start(plan(9_000))
    assert ex.answered(500, b"<html>oops</html>") == Deliver()
    # A client's output cap at the window that may not be lowered: no cap can help, but the
    # overflow rides on the Deliver so the driver still learns the window from it.
    ex = Exchange(dialect=CHAT, mode="auto", policy=Policy(lower_output=False), requested_output_tokens=1_000)
    ex.start(plan(9_000))
    command = ex.answered(400, overflow_body(800, 9_500))
    assert isinstance(command, Deliver) and command.overflow is not None
    assert command.overflow.limit_tokens == 800


def test_a_reserve_at_or_over_the_window_is_lowered_not_a_reason_to_stop() -> None:
    # Our own reserve (1,000: the client set none) is over the 800-token window the error states.
    ex = exchange()
    ex.start(plan(9_000))
    command = ex.answered(400, overflow_body(800, 9_500))
    assert isinstance(command, Replan) and command.limits is not None
    assert command.limits.window_tokens == 800
    assert command.limits.output_cap_tokens is not None and command.limits.output_cap_tokens <= 400
    assert 0 < command.cap_tokens < 800 - command.limits.output_cap_tokens


def test_a_clients_output_cap_over_the_window_is_lowered_to_keep_the_prompt_whole() -> None:
    # Anthropic's numbers: the prompt (3,000) fits; the client's 32,000 output cap does not.
    body = json.dumps(
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "input length and `max_tokens` exceed context limit: 3000 + 32000 > 8000, "
                "decrease input length or `max_tokens` and try again",
            },
        }
    ).encode()
    ex = Exchange(dialect=DIALECTS["messages"], mode="auto", requested_output_tokens=32_000)
    sent = plan(3_000)
    ex.start(sent)
    command = ex.answered(400, body)
    assert isinstance(command, Replan) and command.limits is not None
    assert command.limits.window_tokens == 8_000
    assert command.limits.output_cap_tokens == 8_000 - 3_000 - 80  # the prompt whole, 1% kept free
    assert command.cap_tokens == 3_000
    # The same prompt with the lower cap is smaller for the upstream: it is sent.
    lowered = replace(plan(3_000, changed=True), output_cap_tokens=command.limits.output_cap_tokens)
    assert ex.replanned(lowered) == Send(lowered)
    # Without a lower cap, the same prompt again would not help.
    ex = Exchange(dialect=DIALECTS["messages"], mode="auto", requested_output_tokens=32_000)
    ex.start(sent)
    ex.answered(400, body)
    assert ex.replanned(plan(3_000, changed=True)) == Deliver()


def test_an_overflow_without_numbers_fits_the_retry_to_half_of_what_was_refused() -> None:
    body = json.dumps(
        {
            "error": {
                "message": "Your input exceeds the context window of this model. Please adjust your input "
                "and try again.",
                "type": "invalid_request_error",
                "param": "input",
                "code": "context_length_exceeded",
            }
        }
    ).encode()
    ex = Exchange(dialect=DIALECTS["responses"], mode="auto")
    ex.start(plan(9_000))
    command = ex.answered(400, body)
    assert isinstance(command, Replan) and command.limits is not None
    assert command.limits.window_tokens == 4_500
    assert command.cap_tokens == 4_500


def test_at_most_max_retries_then_the_last_answer_is_delivered_unread() -> None:
    ex = exchange()
    sent = plan(9_000)
    ex.start(sent)
    for k in range(MAX_RETRIES):
        command = ex.answered(400, overflow_body(1_000 * (8 - k), sent.tokens_after + 500))
        assert isinstance(command, Replan)
        sent = plan(command.cap_tokens - 10, changed=True)
        assert ex.replanned(sent) == Send(sent)
    assert ex.retries == MAX_RETRIES and not ex.reads_answer(400)
    assert ex.answered(400, None) == Deliver()


def test_the_fast_path_sends_first_and_learns_its_plan_before_the_answer() -> None:
    ex = exchange()
    assert ex.start_unplanned() == Send(None)
    with pytest.raises(ExchangeStateError):
        ex.answered(200, None)  # the plan of what was sent must be known first
    made = plan(9_000)
    ex.sent(made)
    with pytest.raises(ExchangeStateError):
        ex.sent(made)
    command = ex.answered(400, overflow_body(8_000, 9_500))
    assert isinstance(command, Replan) and command.cap_tokens < made.tokens_after


def test_events_out_of_order_are_refused() -> None:
    ex = exchange()
    with pytest.raises(ExchangeStateError):
        ex.replanned(plan(1))
    ex.start(plan(9_000))
    with pytest.raises(ExchangeStateError):
        ex.start(plan(9_000))
    ex.answered(200, None)
    with pytest.raises(ExchangeStateError):
        ex.answered(200, None)


def test_an_overflow_inside_a_200_stream_is_replanned_and_other_streams_are_delivered() -> None:
    failed = (
        b'event: response.created\ndata: {"type":"response.created","response":{"id":"r"}}\n\n'
        b'event: response.failed\ndata: {"type":"response.failed","response":{"status":"failed",'
        b'"error":{"code":"context_length_exceeded","message":"Your input exceeds the context window of '
        b'this model. Please adjust your input and try again."}}}\n\n'
    )
    ex = Exchange(dialect=DIALECTS["responses"], mode="auto")
    ex.start(plan(9_000))
    assert ex.peeks()
    command = ex.answered_stream(failed)
    assert isinstance(command, Replan) and command.cap_tokens < 9_000
    ok = Exchange(dialect=DIALECTS["responses"], mode="auto")
    ok.start(plan(9_000))
    created = b'event: response.created\ndata: {"type":"response.created"}\n\n'
    assert (
        ok.answered_stream(created + b'event: response.output_text.delta\ndata: {"delta":"x"}\n\n')
        == Deliver()
    )


def test_a_success_after_a_refusal_without_numbers_proves_the_window_it_was_fitted_to() -> None:
    body = json.dumps(
        {
            "error": {
                "message": "Your input exceeds the context window of this model.",
                "code": "context_length_exceeded",
            }
        }
    ).encode()
    ex = Exchange(dialect=DIALECTS["responses"], mode="auto")
    ex.start(plan(9_000))
    command = ex.answered(400, body)
    assert isinstance(command, Replan)
    # The retry, planned in a 4,500-token window (budget 3,600), sends 1,800 tokens and succeeds.
    small = Budget(window_tokens=4_500, reserve_tokens=855, margin_tokens=45, tool_tokens=0)
    retry = replace(plan(1_800, changed=True), budget=small)
    assert ex.replanned(retry) == Send(retry)
    delivered = ex.answered(200, None)
    assert delivered == Deliver(proven_window_tokens=math.ceil(1_800 * 4_500 / 3_600))
    # Without such a refusal a success proves nothing.
    plain = exchange()
    plain.start(plan(500))
    assert plain.answered(200, None) == Deliver()


def test_an_output_cap_lowered_before_stays_lowered_in_the_retry() -> None:
    ex = Exchange(dialect=CHAT, mode="auto", requested_output_tokens=32_000)
    ex.start(replace(plan(9_000, changed=True), output_cap_tokens=20_000))
    command = ex.answered(400, overflow_body(60_000, 62_000))
    assert isinstance(command, Replan) and command.limits is not None
    assert command.limits.output_cap_tokens == 20_000 and command.limits.window_tokens == 60_000
