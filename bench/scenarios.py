"""Request bodies for the benchmark scenarios, built deterministically from a seed.

Text is a mix of English prose, Python-like code, JSON and CJK (Chinese and Japanese), so token
density is realistic for agent sessions (roughly 4-5 characters per token for prose and code,
about 1 token per CJK character). Sizes are *approximate* here (character-based, calibrated once
against o200k_base); the harness reports the exact counts measured by the engine.

Scenarios (letters follow the issue):

* (a) ``small_body``: a fitting ~200-token request.
* (b) ``AgentSession``: a ~100K-token agent conversation (system prompt, task, tool calls with
  their results) resent every turn with one new message appended: the steady state.
* (c) the same builder at ~300K tokens, sent to a 128K-window model: it must be cut.
* (d) ``small_body(stream=True)``: streaming.
* (e) ``counting_corpus``: ~1M tokens of mixed text in many messages, for the engine alone.
* (f) ``small_body`` under concurrency.

``salted`` returns a copy of a message list whose every message differs (a prefix tag), so a
cache keyed on message content misses every message: the cold case.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

Message = dict[str, Any]

SMALL_MODEL = "bench-200k"
CUT_MODEL = "bench-128k"
CL100K_MODEL = "bench-cl100k"

# Operator TOML for the proxy under test (format of config/models.toml).
MODELS_TOML = f"""\
[models."{SMALL_MODEL}"]
window = 200000
max_output = 16384
encoding = "o200k_base"

[models."{CUT_MODEL}"]
window = 128000
max_output = 16384
encoding = "o200k_base"

[models."{CL100K_MODEL}"]
window = 128000
max_output = 4096
encoding = "cl100k_base"
"""

# Characters per o200k token of each generator below (measured once; only used for sizing).
CHARS_PER_TOKEN = {"prose": 5.5, "code": 4.1, "json": 3.0, "cjk": 1.0}

_WORDS_TEXT = (
    "the of and to in is that for it as with was on be by this are from or at an not which have "
    "but they his her all were when we there can been one has more their if will would about "
    "into so some could them other than then its these only two new time may also after like "
    "first any work over such our most where way even because between through should each well "
    "system request model token context window budget message conversation agent tool result "
    "function session history summary file line error value number string table query server "
    "client proxy upstream latency memory process thread buffer stream chunk header response "
    "network policy strategy output input prompt cache count engine benchmark report figure run "
    "measure median percentile throughput concurrency worker event loop python library module "
    "carefully quickly usually exactly roughly simply directly together without within against "
    "under large small long short fast slow high low early late recent older newer important"
)
_WORDS = _WORDS_TEXT.split()

_IDENTS_TEXT = (
    "user_id payload items result config session handler request response count total index "
    "offset limit buffer tokens window budget message parts cache key value entry record path "
    "name status retries timeout deadline stream chunk encoder decoder parser registry spec"
)
_IDENTS = _IDENTS_TEXT.split()

_CJK = (
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家"
    "学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见"
    "经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话"
    "模型上下文窗口令牌预算消息会话代理工具结果函数历史摘要文件错误数值服务器客户端延迟内存"
)
_KANA = "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをん"


def prose(rng: random.Random, approx_tokens: int) -> str:
    """English-like sentences of about ``approx_tokens`` o200k tokens."""
    target = int(approx_tokens * CHARS_PER_TOKEN["prose"])
    out: list[str] = []
    size = 0
    while size < target:
        n = rng.randint(6, 18)
        words = rng.choices(_WORDS, k=n)
        sentence = " ".join(words).capitalize() + rng.choice((". ", ". ", ", and ", "; ", "? "))
        out.append(sentence)
        size += len(sentence)
    return "".join(out)


def code(rng: random.Random, approx_tokens: int) -> str:
    """Python-like source of about ``approx_tokens`` tokens."""
    target = int(approx_tokens * CHARS_PER_TOKEN["code"])
    out: list[str] = []
    size = 0
    while size < target:
        a, b, c = rng.sample(_IDENTS, 3)
        n = rng.randint(2, 400)
        block = (
            f"def {a}_{b}_{n}({a}, {b}=None, *, {c}={n}):\n"
            f'    """Return the {b} of {a} within {c}."""\n'
            f"    if {b} is None:\n"
            f"        {b} = {{}}\n"
            f"    for i, {c}_item in enumerate({a}[{n % 7}:]):\n"
            f"        {b}[{c}_item.key] = {c}_item.value * {n} + i\n"
            f"        if len({b}) > {c}:\n"
            f'            raise ValueError(f"{a} too large: {{len({b})}}")\n'
            f"    return {b}\n\n"
        )
        out.append(block)
        size += len(block)
    return "".join(out)


def json_text(rng: random.Random, approx_tokens: int) -> str:
    """A JSON document (a list of records) of about ``approx_tokens`` tokens."""
    target = int(approx_tokens * CHARS_PER_TOKEN["json"])
    records: list[dict[str, Any]] = []
    size = 2
    while size < target:
        rec = {
            "id": rng.randint(1, 10**9),
            "name": "_".join(rng.sample(_IDENTS, 2)),
            "score": round(rng.random() * 100, 3),
            "tags": rng.sample(_IDENTS, 3),
            "active": rng.random() < 0.5,
        }
        records.append(rec)
        size += len(orjson.dumps(rec, option=orjson.OPT_INDENT_2)) + 4
    return orjson.dumps(records, option=orjson.OPT_INDENT_2).decode()


def cjk(rng: random.Random, approx_tokens: int) -> str:
    """Chinese sentences with some Japanese kana, about ``approx_tokens`` tokens."""
    target = int(approx_tokens * CHARS_PER_TOKEN["cjk"])
    out: list[str] = []
    size = 0
    while size < target:
        n = rng.randint(8, 30)
        pool = _KANA if rng.random() < 0.2 else _CJK
        sentence = "".join(rng.choices(pool, k=n)) + rng.choice("。，、！？")
        out.append(sentence)
        size += len(sentence)
    return "".join(out)


_KINDS = {"prose": prose, "code": code, "json": json_text, "cjk": cjk}
MIX = (("prose", 0.45), ("code", 0.25), ("json", 0.2), ("cjk", 0.1))


def mixed(rng: random.Random, approx_tokens: int) -> str:
    """Mixed prose, code, JSON and CJK in the proportions of ``MIX``."""
    parts = [_KINDS[kind](rng, max(1, int(approx_tokens * share))) for kind, share in MIX]
    return "\n\n".join(parts)


def small_body(*, model: str = SMALL_MODEL, stream: bool = False, seed: int = 1) -> dict[str, Any]:
    """Scenario (a)/(d)/(f): a system prompt and one question, ~200 tokens."""
    rng = random.Random(seed)
    body: dict[str, Any] = {
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a concise assistant. " + prose(rng, 60)},
            {"role": "user", "content": prose(rng, 120) + " What do you suggest?"},
        ],
        "max_tokens": 256,
    }
    if stream:
        body["stream"] = True
    return body


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository and return its text.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "Path from the repo root"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_query",
            "description": "Run a read-only query and return rows as JSON.",
            "parameters": {
                "type": "object",
                "properties": {
                    "sql": {"type": "string"},
                    "limit": {"type": "integer", "enum": [10, 100, 1000]},
                },
                "required": ["sql"],
            },
        },
    },
]


def agent_opening(rng: random.Random, *, system_tokens: int, task_tokens: int) -> list[Message]:
    """A coding agent's system prompt and task, of about the tokens given."""
    return [
        {"role": "system", "content": "You are a coding agent. " + prose(rng, system_tokens)},
        {"role": "user", "content": "Task: " + prose(rng, task_tokens)},
    ]


def agent_messages(*, approx_tokens: int, seed: int = 7, tool_result_tokens: int = 2500) -> list[Message]:
    """An agent conversation of about ``approx_tokens`` tokens that ends with a user message.

    Every assistant ``tool_calls`` message is followed by all of its tool results, so the
    conversation is valid for any strategy.
    """
    rng = random.Random(seed)
    messages = agent_opening(rng, system_tokens=400, task_tokens=150)
    total = 560
    call = 0
    while total < approx_tokens:
        call += 1
        call_id = f"call_{seed}_{call:05d}"
        if rng.random() < 0.5:
            name, args = "read_file", {"path": f"src/{rng.choice(_IDENTS)}/{rng.choice(_IDENTS)}.py"}
            result = code(rng, tool_result_tokens)
        else:
            name, args = "run_query", {"sql": f"select * from {rng.choice(_IDENTS)}", "limit": 100}
            result = json_text(rng, tool_result_tokens)
        messages.append(
            {
                "role": "assistant",
                "content": prose(rng, 50),
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": orjson.dumps(args).decode()},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        text_tokens = 150
        content = cjk(rng, text_tokens) if call % 5 == 0 else prose(rng, text_tokens)
        messages.append({"role": "assistant", "content": content})
        messages.append({"role": "user", "content": prose(rng, 40)})
        total += 60 + tool_result_tokens + text_tokens + 50 + 20
    return messages


def salted(messages: Sequence[Message], salt: str) -> list[Message]:
    """A copy whose every string ``content`` starts with ``[salt]``: new to any content cache."""
    out: list[Message] = []
    for m in messages:
        content = m.get("content")
        out.append({**m, "content": f"[{salt}] {content}"} if isinstance(content, str) else dict(m))
    return out


def chat_body(messages: Sequence[Message], *, model: str, tools: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": list(messages), "max_tokens": 1024}
    if tools:
        body["tools"] = TOOLS
    return body


def dumps(body: dict[str, Any]) -> bytes:
    return orjson.dumps(body)


@dataclass
class AgentSession:
    """Scenario (b): one conversation resent every turn with one more user message.

    ``next_body()`` returns the next turn's bytes (history + one new message). The new messages
    are generated up front so building a turn costs only the serialization.
    """

    approx_tokens: int
    model: str = SMALL_MODEL
    seed: int = 11
    max_turns: int = 2000
    base: list[Message] = field(init=False)
    _new: list[Message] = field(init=False)
    _turn: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.base = agent_messages(approx_tokens=self.approx_tokens, seed=self.seed)
        rng = random.Random(self.seed + 1)
        self._new = [
            {"role": "user", "content": f"Turn {i}: " + prose(rng, 40)} for i in range(self.max_turns)
        ]

    def body_at(self, turn: int) -> dict[str, Any]:
        """History plus ``turn`` new messages (turn 0 is the base conversation)."""
        return chat_body([*self.base, *self._new[:turn]], model=self.model)

    def next_body(self) -> bytes:
        self._turn += 1
        return dumps(self.body_at(self._turn))


def counting_corpus(
    *, approx_tokens: int = 1_000_000, seed: int = 3, message_tokens: int = 2000
) -> dict[str, Any]:
    """Scenario (e): ~``approx_tokens`` of mixed text in messages of ~``message_tokens`` each."""
    rng = random.Random(seed)
    messages: list[Message] = []
    n = max(1, approx_tokens // message_tokens)
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        messages.append({"role": role, "content": mixed(rng, message_tokens)})
    return {"model": SMALL_MODEL, "messages": messages}
