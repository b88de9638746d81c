"""Builders of Responses API bodies for the dialect's tests, and the pipeline driven through it.

``fit`` plans a Responses body the way the service does (``plan_request`` with the dialect) and
returns the body that would be forwarded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from app.core.budget import Policy
from app.core.dialects.responses import RESPONSES
from app.core.fit import plan_request
from app.core.plan import Plan
from app.core.tokens import MessageCounter
from tests.core.fakes import SPEC


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def said(text: str, *, item_id: str = "msg_1") -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def call(call_id: str, *, name: str = "exec_command", args: str = '{"cmd": "ls"}') -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": name,
        "arguments": args,
        "status": "completed",
    }


def output(call_id: str, text: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def reasoning(item_id: str, *, secret_chars: int = 400, summary: str = "thinking") -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": item_id,
        "summary": [{"type": "summary_text", "text": summary}] if summary else [],
        "encrypted_content": ("gAAAA" + "x" * secret_chars)[:secret_chars],
    }


def body(items: Sequence[dict[str, Any]] | str, **extra: Any) -> dict[str, Any]:
    return {"model": "test-model", "input": items if isinstance(items, str) else list(items), **extra}


def fit(
    request: dict[str, Any], *, cap_tokens: int, counter: MessageCounter, policy: Policy | None = None
) -> tuple[Plan, dict[str, Any]]:
    """Plan ``request`` through the Responses dialect; the plan and the body it would forward."""
    plan = plan_request(
        request,
        spec=SPEC,
        policy=policy or Policy(),
        counter=counter,
        cap_tokens=cap_tokens,
        dialect=RESPONSES,
    )
    return plan, (plan.body(request) if plan.changed else request)


def dumps(item: Any) -> str:
    return json.dumps(item, sort_keys=True)
