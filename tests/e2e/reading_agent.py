"""The scripted file-reading model and workspace that the real-agent e2e tests share (Codex CLI,
the OpenAI Agents SDK): a model that reads ``file0.txt`` ... one per step with a tool call (each
step with a sealed reasoning item) until every file is read, then says ``DONE``."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tests.fake_responses_upstream import Responder
from tests.fake_upstream import FakeModel

DONE = "I have read all the files."


def write_files(work: Path, *, files: int, lines: int) -> None:
    """``file0.txt`` ... in ``work``, ``lines`` lines each (~9 tokens a line)."""
    for k in range(files):
        text = "\n".join(
            f"file {k} line {i}: the quick brown fox jumps over the lazy dog" for i in range(lines)
        )
        (work / f"file{k}.txt").write_text(text, encoding="utf-8")


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
    say ``DONE``. The next file follows the newest call in the input (``file_of`` its decoded
    arguments): what a model sees even when older steps were cut."""

    def script(body: Mapping[str, Any]) -> list[dict[str, Any]]:
        calls = [i for i in body.get("input", []) if isinstance(i, dict) and i.get("type") == "function_call"]
        done = file_of(json.loads(calls[-1]["arguments"])) + 1 if calls else 0
        if done < files:
            return [
                {"reasoning": f"I should read file{done}.txt next."},
                {"call": tool, "arguments": json.dumps(arguments(done))},
            ]
        return [{"reasoning": "Every file is read."}, {"text": DONE}]

    return script
