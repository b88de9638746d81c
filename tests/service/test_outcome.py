"""The service's answer values: the cannot-fit error carries its plan's numbers, readiness."""

from __future__ import annotations

from app.core.budget import Policy
from app.core.dialects import CHAT
from app.core.fit import plan_request
from app.service.outcome import PlanCannotFit, Readiness
from app.service.report import request_budget_tokens
from tests.core.fakes import SPEC, FakeMessageCounter, body, chat


def test_cannot_fit_carries_the_plan_and_its_numbers() -> None:
    plan = plan_request(
        body(chat(6)),
        spec=SPEC,
        policy=Policy(mode="reject"),
        counter=FakeMessageCounter(),
        cap_tokens=20,
        dialect=CHAT,
    )
    error = PlanCannotFit(plan, reason="policy reject")
    assert error.plan is plan and not plan.fits
    assert error.tokens == plan.tokens_after and error.budget_tokens == request_budget_tokens(plan.budget)
    assert "policy reject" in error.message and plan.dialect is CHAT


def test_ready_only_with_every_vocabulary_and_every_upstream_answering() -> None:
    assert Readiness(("o200k_base",), True, {"http://a": 200, "http://b": 404}).ready
    assert not Readiness(("o200k_base",), True, {"http://a": 200, "http://b": None}).ready
    assert not Readiness((), False, {"http://a": 200}).ready
