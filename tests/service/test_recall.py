"""The recall store: keyed by tenant and conversation, bounded in time, shared through Redis."""

from __future__ import annotations

import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import httpx
import respx

from app.compaction.cache import MemoryCache
from app.core.dialects import MESSAGES
from app.core.recall import Recallable, recall_ref
from app.core.tenant import tenant_of
from app.service.recall import Recall, conversation_key
from app.settings import Settings
from tests.api import UPSTREAM, chat_ok, proxy
from tests.compaction.conftest import RedisServer, free_port, start_redis

OPENING = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Fix the bug."}]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def request(
    headers: list[tuple[str, str]], *, opening: list[dict[str, Any]] = OPENING, query: str = ""
) -> Any:
    """The parts of a request value the store reads."""
    return SimpleNamespace(
        headers=tuple(headers),
        tenant=tenant_of(headers, query, MESSAGES.key_slots),
        route=SimpleNamespace(query=query),
        dialect=MESSAGES,
        conversation=SimpleNamespace(messages=tuple(opening)),
    )


def plan(*texts: str) -> Any:
    return SimpleNamespace(recall=tuple(Recallable(recall_ref(t), t) for t in texts))


def test_the_conversation_is_a_hash_of_its_opening() -> None:
    assert conversation_key(OPENING) == conversation_key([*OPENING, {"role": "assistant", "content": "ok"}])
    assert conversation_key(OPENING) != conversation_key([OPENING[0], {"role": "user", "content": "Other."}])


async def test_what_a_cut_removed_is_read_back_only_by_its_tenant_and_conversation() -> None:
    clock = Clock()
    recall = Recall(settings=Settings(), store=MemoryCache(100, 60.0, clock=clock))
    mine = request([("x-api-key", "key-a")])
    recall.remember(mine, plan("the exact error text"))
    await recall.flush()
    ref = recall_ref("the exact error text")
    assert await recall.lookup(mine, ref) == "the exact error text"
    assert await recall.lookup(request([("x-api-key", "key-b")]), ref) is None
    other = [OPENING[0], {"role": "user", "content": "Another task."}]
    assert await recall.lookup(request([("x-api-key", "key-a")], opening=other), ref) is None
    clock.now += 61  # expired
    assert await recall.lookup(mine, ref) is None
    await recall.aclose()


async def test_an_entry_is_written_once_while_it_is_fresh() -> None:
    store = MemoryCache(100, 60.0)
    recall = Recall(settings=Settings(), store=store)
    for _ in range(3):
        recall.remember(request([("x-api-key", "k")]), plan("one", "two"))
        await recall.flush()
    assert store.stats().sets == 2
    await recall.aclose()


async def test_any_replica_answers_through_redis(tmp_path: Any) -> None:
    server: RedisServer = start_redis(free_port(), tmp_path)
    try:
        settings = Settings(cache_url=server.url)
        writer, reader = Recall(settings=settings), Recall(settings=settings)
        mine = request([("authorization", "Bearer sk-a")])
        recall_text = "a long tool output " * 50
        writer.remember(mine, plan(recall_text))
        await writer.flush()
        assert await reader.lookup(mine, recall_ref(recall_text)) == recall_text
        assert (
            await reader.lookup(request([("authorization", "Bearer sk-b")]), recall_ref(recall_text)) is None
        )
        await writer.aclose()
        await reader.aclose()
    finally:
        server.kill()


def test_the_in_process_store_is_bounded_in_size() -> None:
    recall = Recall(settings=Settings(recall_max_mb=1))
    store: Callable[..., Any] = recall.store  # type: ignore[assignment]
    assert getattr(store, "max_bytes", None) == 1024 * 1024


async def test_the_header_turns_recall_on_for_one_request_when_the_setting_is_off() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(f"{UPSTREAM}/chat/completions").mock(return_value=httpx.Response(200, json=chat_ok()))
    messages = [{"role": "system", "content": "terse"}] + [
        {"role": role, "content": " ".join(f"{role}{k}w{i}" for i in range(120))}
        for k in range(12)
        for role in ("user", "assistant")
    ]
    body = {"model": "gpt-test", "messages": [*messages, {"role": "user", "content": "and now?"}]}
    async with proxy(router, recall=False) as (client, _):
        off = await client.post("/v1/chat/completions", json=body)
        on = await client.post("/v1/chat/completions", json=body, headers={"X-Context-Recall": "on"})
    assert off.status_code == on.status_code == 200
    first, second = (json.loads(call.request.content) for call in route.calls)
    assert "tools" not in first and "recall id" not in json.dumps(first)
    assert [t["function"]["name"] for t in second["tools"]] == ["ctx_recall"] and "recall id" in json.dumps(
        second
    )
    assert "x-context-recalls" not in off.headers and on.headers["x-context-recalls"] == "0"
