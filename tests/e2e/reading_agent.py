"""The scripted reading models and the workspace the real-agent e2e tests share (Claude Code, Codex
CLI, the OpenAI Agents SDK).

The model reads ``file0.txt`` ... one per step with the agent's own tool, never restating what it
read (a real model keeps nothing between requests but its input: a fact lives in the tool result,
or in what the proxy remembers of it), then answers with every fact it can still see in its input
(tool results, summaries). Each file holds one fact in the middle of repetitive lines.

* ``write_fact_files(root, *, files, name, lines, fact_line)``: the files (about 21 tokens a line),
  their paths; ``fact_of(path)`` the fact a file holds.
* ``reading_script(files=, tool=, arguments=, file_of=)``: the Responses fake's responder (Codex,
  the Agents SDK): each step a sealed reasoning item and a call; at the end ``DONE`` and the facts.
* ``ReadingClaude(paths, recalls=0)``: the Anthropic fake's script (Claude Code's ``Read`` tool);
  ``recalling(script, recalls=)``: the Responses one, made to fetch back ``recalls`` removed
  contents with ``ctx_recall`` (when the proxy offers it) before its answer, as ``ReadingClaude``
  does with ``recalls``.
* ``StatusRecorder(app, path_prefix=)``: an ASGI wrapper that records the statuses the proxy
  answers (so a test sees a refusal the upstream never saw).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from tests.fake_anthropic_upstream import loop_start
from tests.fake_recaller import RECALL_TOOL, next_recall
from tests.fake_responses_upstream import Responder
from tests.fake_upstream import FakeModel

DONE = "I have read all the files."
FACT = re.compile(r"FACT-[\w-]+")
FACT_LINE = 75


def write_fact_files(
    root: Path, *, files: int, name: str = "file{k}.txt", lines: int = 150, fact_line: int = FACT_LINE
) -> list[Path]:
    """``files`` files in ``root`` (``name`` formatted with ``k``), ``lines`` lines each, one fact
    at line ``fact_line`` (the middle by default); their paths, in order."""
    paths = []
    for k in range(files):
        text = [
            f"line {i} of part {k}: the quick brown fox jumps over the lazy dog {i * 7 + k}"
            for i in range(lines)
        ]
        text[min(fact_line, lines - 1)] = f"The secret of part {k} is FACT-part{k}-{k * 1111 + 7}."
        path = root / name.format(k=k)
        path.write_text("\n".join(text), encoding="utf-8")
        paths.append(path)
    return paths


def fact_of(path: Path) -> str:
    found = FACT.search(path.read_text(encoding="utf-8"))
    assert found is not None
    return found.group(0).rstrip(".")


def facts_in(value: object) -> list[str]:
    """Every fact in a request body, first seen first (what the model can still see)."""
    return list(dict.fromkeys(f.rstrip(".") for f in FACT.findall(json.dumps(value))))


def write_models_file(path: Path, model: FakeModel) -> Path:
    """A one-model table for the proxy (``CTXPROXY_MODELS_FILE``) at ``path``."""
    path.write_text(
        f'[models."{model.name}"]\nwindow = {model.window_tokens}\nmax_output = {model.max_output_tokens}\n'
        f'encoding = "{model.encoding}"\n',
        encoding="utf-8",
    )
    return path


def reading_script(
    *, files: int, tool: str, arguments: Callable[[int], Mapping[str, Any]], file_of: Callable[[Any], int]
) -> Responder:
    """The fake model's responder: call ``tool`` with ``arguments(k)`` for the next file ``k``, then
    say ``DONE`` with every fact it can see. The next file follows the newest call in the input
    (``file_of`` its decoded arguments): what a model sees even when older steps were cut."""

    def script(body: Mapping[str, Any]) -> list[dict[str, Any]]:
        calls = [i for i in body.get("input", []) if isinstance(i, dict) and i.get("type") == "function_call"]
        done = file_of(json.loads(calls[-1]["arguments"])) + 1 if calls else 0
        if done < files:
            return [
                {"reasoning": f"I should read file{done}.txt next."},
                {"call": tool, "arguments": json.dumps(arguments(done))},
            ]
        seen = facts_in([body.get("instructions"), body.get("input")])
        return [{"reasoning": "Every file is read."}, {"text": f"{DONE} {' '.join(seen)}"}]

    return script


def recalling(script: Responder, *, recalls: int) -> Responder:
    """``script`` that, instead of its final answer, first fetches back up to ``recalls`` removed
    contents with ``ctx_recall`` (one a step), when the proxy offers the tool. Once it has called
    ``ctx_recall`` it knows its reading is done (the proxy may have cut its reads by then)."""

    def respond(body: Mapping[str, Any]) -> list[dict[str, Any]]:
        items = [i for i in body.get("input") or [] if isinstance(i, dict)]
        fetched = [
            json.loads(i.get("arguments") or "{}").get("id")
            for i in items
            if i.get("type") == "function_call" and i.get("name") == RECALL_TOOL
        ]
        if not fetched:
            answer = script(body)
            if any(spec.get("call") for spec in answer):
                return answer
        offered = any(isinstance(t, dict) and t.get("name") == RECALL_TOOL for t in body.get("tools") or [])
        ref = next_recall(json.dumps(items), offered=offered, fetched=fetched, limit=recalls)
        if ref is None:
            seen = facts_in([body.get("instructions"), body.get("input")])
            return [{"reasoning": "Every file is read."}, {"text": f"{DONE} {' '.join(seen)}"}]
        call = {"call": RECALL_TOOL, "arguments": json.dumps({"id": ref})}
        return [{"reasoning": "An early file was cut."}, call]

    return respond


class ReadingClaude:
    """The Anthropic fake's script: reads the files in order with ``Read``, restating nothing;
    then fetches back up to ``recalls`` removed contents with ``ctx_recall`` when the proxy offers
    it; then None (the fake's answer: every fact it was sent)."""

    def __init__(self, paths: list[Path], *, recalls: int = 0) -> None:
        self.paths = [str(p) for p in paths]
        self.recalls = recalls
        self._ids = itertools.count(1)

    def __call__(self, body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        if "Read" not in {t.get("name") for t in body.get("tools") or [] if isinstance(t, Mapping)}:
            return None  # a compaction or side request: the fake's default answer
        messages = body["messages"]
        if RECALL_TOOL in json.dumps(messages):
            return self._recall(body)  # it recalls once its reading is done (its reads may be cut)
        asked = [
            self.paths.index(b["input"]["file_path"])
            for m in messages[loop_start(messages) :]
            if m.get("role") == "assistant" and isinstance(m.get("content"), list)
            for b in m["content"]
            if b.get("type") == "tool_use" and b.get("input", {}).get("file_path") in self.paths
        ]
        reads = max(asked) + 1 if asked else 0
        if reads >= len(self.paths):
            return self._recall(body)
        call = {
            "type": "tool_use",
            "id": f"toolu_r{next(self._ids):05d}",
            "name": "Read",
            "input": {"file_path": self.paths[reads]},
        }
        return [{"type": "text", "text": f"Reading part {reads}."}, call]

    def _recall(self, body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        messages = body["messages"]
        fetched = [
            b["input"].get("id")
            for m in messages
            if m.get("role") == "assistant" and isinstance(m.get("content"), list)
            for b in m["content"]
            if b.get("type") == "tool_use" and b.get("name") == RECALL_TOOL
        ]
        offered = RECALL_TOOL in {t.get("name") for t in body.get("tools") or [] if isinstance(t, Mapping)}
        ref = next_recall(json.dumps(messages), offered=offered, fetched=fetched, limit=self.recalls)
        if ref is None:
            return None
        call = {
            "type": "tool_use",
            "id": f"toolu_k{next(self._ids):05d}",
            "name": RECALL_TOOL,
            "input": {"id": ref},
        }
        return [{"type": "text", "text": "An early part was cut; fetching it back."}, call]


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]


class StatusRecorder:
    """An ASGI app around ``app`` that records the status of every answer to a path under
    ``path_prefix`` (what the proxy itself answered, refusals included)."""

    def __init__(self, app: Any, *, path_prefix: str) -> None:
        self.app = app
        self.path_prefix = path_prefix
        self.statuses: list[int] = []

    async def __call__(
        self,
        scope: Scope,
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        if scope.get("type") != "http" or not str(scope.get("path", "")).startswith(self.path_prefix):
            await self.app(scope, receive, send)
            return

        async def recorded(message: Message) -> None:
            if message.get("type") == "http.response.start":
                self.statuses.append(int(message["status"]))
            await send(message)

        await self.app(scope, receive, recorded)
