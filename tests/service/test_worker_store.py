"""Workers of one server share learned knowledge through files (no Redis)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from app.core.knowledge import Knowledge
from app.core.overflow import ContextOverflow
from app.core.registry import ModelSpec
from app.service.knowledge_share import KnowledgeShare
from app.service.worker_store import WorkerStore

MODEL = "acme/llm"
T = "t-alice"
SPEC = ModelSpec(name=MODEL, window_tokens=8192, max_output_tokens=2048, encoding="estimate")


async def test_what_one_worker_learns_reaches_another(tmp_path: Path) -> None:
    store_a, store_b = WorkerStore(tmp_path / "knowledge"), WorkerStore(tmp_path / "knowledge")
    a, b = Knowledge(), Knowledge()
    share_a = KnowledgeShare(store_a, a, publish_delay_s=0.0)
    share_b = KnowledgeShare(store_b, b, publish_delay_s=0.0)
    overflow = ContextOverflow("llamacpp", limit_tokens=4096, prompt_tokens=1310)
    a.observe_overflow(MODEL, overflow, fixed_tokens=10, text_tokens=1000, exact=False, tenant=T)
    share_a.changed(MODEL, tenant=T)
    await asyncio.sleep(0.05)
    await share_b.sync(MODEL, tenant=T)
    spec = b.effective(SPEC, tenant=T)
    assert spec.window_tokens == 4096 and spec.source == "learned:overflow"
    await share_a.aclose()
    await share_b.aclose()


async def test_a_value_round_trips_and_a_missing_or_odd_key_is_a_miss(tmp_path: Path) -> None:
    store = WorkerStore(tmp_path / "kn")
    assert await store.get("knowledge:abc") is None
    await store.set("knowledge:abc", '{"x": 1}', ttl_s=60)
    assert await store.get("knowledge:abc") == '{"x": 1}'
    assert [p.name for p in (tmp_path / "kn").iterdir()] == ["knowledge_abc.json"]
    await store.set("../../escape", "v")
    assert not (tmp_path.parent / "escape.json").exists()
    assert await store.get("../../escape") == "v"


async def test_a_store_it_cannot_write_drops_the_value(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory", encoding="utf-8")
    store = WorkerStore(blocker / "knowledge")
    await store.set("k", "v")  # never raises
    assert await store.get("k") is None


async def test_compare_and_set_between_workers(tmp_path: Path) -> None:
    a, b = WorkerStore(tmp_path / "kn"), WorkerStore(tmp_path / "kn")
    assert await a.compare_and_set("k", None, "one") is True
    assert await b.compare_and_set("k", None, "two") is False  # a wrote first
    assert await b.compare_and_set("k", "one", "two") is True
    assert await a.compare_and_set("k", "one", "three") is False  # stale
    assert await a.get("k") == "two"
