"""The same requests on every wire API the proxy fits: chat, ``/v1/responses``, ``/v1/messages``,
Gemini's ``/v1beta/models/{model}:generateContent``.

Scenario (r) compares the proxy's routes with each other: each request is one neutral chat
conversation written in each API's shape (``responses_body``, ``messages_body``,
``gemini_body``), so the four routes carry the same text, tools and tool calls, and the
difference in added latency is the route's own (its dialect's parse, count and render, its
answer's parsing for calibration).

* ``ROUTES``: ``chat``, ``responses``, ``messages``, ``gemini`` with their path and extra headers
  (Anthropic's ``x-api-key`` and ``anthropic-version``, Google's ``x-goog-api-key`` and
  ``x-goog-api-client``, as their SDKs send them).
* ``small(route)``: the small fitting request of scenario (a) in that shape.
* ``RouteSession``: a ~100K-token agent session resent every turn with one more exchange (an
  assistant answer and a user message, so Anthropic's alternating roles hold), in every shape.

Conversions keep what each API has: the system prompt becomes Responses ``instructions``,
Anthropic ``system`` and Gemini ``systemInstruction``; an assistant message with ``tool_calls``
becomes a ``message`` item plus ``function_call`` items (Responses), ``text`` + ``tool_use``
blocks (Anthropic) or a ``model`` content with ``text`` + ``functionCall`` parts (Gemini); a
``tool`` message becomes a ``function_call_output`` item, a ``tool_result`` block or a
``functionResponse`` part in the next user message/content. Pure functions of their input,
deterministic.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from bench import load, scenarios
from bench.scenarios import Message


@dataclass(frozen=True, slots=True)
class Route:
    """One wire API: where it is served and the headers its clients add."""

    name: str
    path: str
    headers: tuple[tuple[str, str], ...] = ()


ROUTES = (
    Route("chat", "/v1/chat/completions"),
    Route("responses", "/v1/responses"),
    Route("messages", "/v1/messages", (("x-api-key", "sk-bench"), ("anthropic-version", "2023-06-01"))),
    # The model is in the path (every (r) request is for the same model, scenarios.SMALL_MODEL).
    Route(
        "gemini",
        f"/v1beta/models/{scenarios.SMALL_MODEL}:generateContent",
        (("x-goog-api-key", "sk-bench"), ("x-goog-api-client", "google-genai-sdk/1.30.0 gl-python/3.11")),
    ),
)
BY_NAME = {r.name: r for r in ROUTES}


def _text_of(content: Any) -> str:
    return content if isinstance(content, str) else ""


def responses_body(chat: dict[str, Any]) -> dict[str, Any]:
    """A chat body as a Responses API body (``instructions``, ``input`` items, flat tools)."""
    instructions: list[str] = []
    items: list[dict[str, Any]] = []
    for m in chat["messages"]:
        role = m["role"]
        if role in ("system", "developer"):
            instructions.append(_text_of(m["content"]))
        elif role == "tool":
            items.append(
                {"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]}
            )
        else:
            kind = "output_text" if role == "assistant" else "input_text"
            if m.get("content"):
                part = {"type": kind, "text": _text_of(m["content"])}
                items.append({"type": "message", "role": role, "content": [part]})
            for call in m.get("tool_calls") or ():
                function = call["function"]
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call["id"],
                        "name": function["name"],
                        "arguments": function["arguments"],
                    }
                )
    body: dict[str, Any] = {"model": chat["model"], "input": items}
    if instructions:
        body["instructions"] = "\n\n".join(instructions)
    if "max_tokens" in chat:
        body["max_output_tokens"] = chat["max_tokens"]
    if chat.get("tools"):
        body["tools"] = [{"type": "function", **t["function"]} for t in chat["tools"]]
    if chat.get("stream"):
        body["stream"] = True
    return body


def messages_body(chat: dict[str, Any]) -> dict[str, Any]:
    """A chat body as an Anthropic Messages body (``system``, content blocks, ``input_schema``
    tools); tool results join the user message after them, consecutive same-role messages merge."""
    system: list[str] = []
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for m in chat["messages"]:
        role = m["role"]
        if role in ("system", "developer"):
            system.append(_text_of(m["content"]))
        elif role == "tool":
            add("user", [{"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}])
        else:
            blocks: list[dict[str, Any]] = []
            if m.get("content"):
                blocks.append({"type": "text", "text": _text_of(m["content"])})
            for call in m.get("tool_calls") or ():
                function = call["function"]
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call["id"],
                        "name": function["name"],
                        "input": orjson.loads(function["arguments"]),
                    }
                )
            add(role, blocks)
    body: dict[str, Any] = {
        "model": chat["model"],
        "max_tokens": chat.get("max_tokens", 1024),
        "messages": out,
    }
    if system:
        body["system"] = "\n\n".join(system)
    if chat.get("tools"):
        body["tools"] = [
            {
                "name": t["function"]["name"],
                "description": t["function"].get("description", ""),
                "input_schema": t["function"].get("parameters", {"type": "object"}),
            }
            for t in chat["tools"]
        ]
    if chat.get("stream"):
        body["stream"] = True
    return body


def gemini_body(chat: dict[str, Any]) -> dict[str, Any]:
    """A chat body as a Gemini ``generateContent`` body (``systemInstruction``, ``contents`` of
    ``user``/``model`` parts, ``functionDeclarations`` with ``parametersJsonSchema`` as gemini-cli
    declares them); function responses join the user content after their calls, consecutive
    same-role contents merge, calls and responses carry the chat ids (as gemini-cli puts its own).
    The model is in the path, not the body."""
    system: list[str] = []
    out: list[dict[str, Any]] = []

    def add(role: str, parts: list[dict[str, Any]]) -> None:
        if out and out[-1]["role"] == role:
            out[-1]["parts"].extend(parts)
        else:
            out.append({"role": role, "parts": parts})

    names: dict[str, str] = {}
    for m in chat["messages"]:
        role = m["role"]
        if role in ("system", "developer"):
            system.append(_text_of(m["content"]))
        elif role == "tool":
            name = names.get(m["tool_call_id"], "tool")
            response = {"id": m["tool_call_id"], "name": name, "response": {"output": m["content"]}}
            add("user", [{"functionResponse": response}])
        else:
            parts: list[dict[str, Any]] = []
            if m.get("content"):
                parts.append({"text": _text_of(m["content"])})
            for call in m.get("tool_calls") or ():
                function = call["function"]
                names[call["id"]] = function["name"]
                args = orjson.loads(function["arguments"])
                parts.append({"functionCall": {"id": call["id"], "name": function["name"], "args": args}})
            add("model" if role == "assistant" else "user", parts)
    body: dict[str, Any] = {"contents": out}
    if system:
        body["systemInstruction"] = {"parts": [{"text": "\n\n".join(system)}]}
    if chat.get("tools"):
        declarations = [
            {
                "name": t["function"]["name"],
                "description": t["function"].get("description", ""),
                "parametersJsonSchema": t["function"].get("parameters", {"type": "object"}),
            }
            for t in chat["tools"]
        ]
        body["tools"] = [{"functionDeclarations": declarations}]
    if "max_tokens" in chat:
        body["generationConfig"] = {"maxOutputTokens": chat["max_tokens"]}
    return body


SHAPES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "chat": lambda body: body,
    "responses": responses_body,
    "messages": messages_body,
    "gemini": gemini_body,
}


def in_shape(route: str, chat: dict[str, Any]) -> bytes:
    """``chat`` written in ``route``'s shape, serialized."""
    return orjson.dumps(SHAPES[route](chat))


def small(route: str, *, stream: bool = False) -> bytes:
    """Scenario (a)'s small fitting request in ``route``'s shape."""
    return in_shape(route, scenarios.small_body(stream=stream))


@dataclass
class RouteSession:
    """A ~``approx_tokens`` agent session resent every turn with one more exchange, per route.

    ``next_bodies()`` returns the next turn's body in every route's shape (the same conversation),
    so one interleaved iteration sends each route the same content.
    """

    approx_tokens: int
    model: str = scenarios.SMALL_MODEL
    seed: int = 31
    max_turns: int = 2000
    base: list[Message] = field(init=False)
    _turn: int = field(init=False, default=0)
    _rng: random.Random = field(init=False)
    _added: list[Message] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.base = scenarios.agent_messages(approx_tokens=self.approx_tokens, seed=self.seed)
        self._rng = random.Random(self.seed + 1)

    def chat_at(self, messages: Sequence[Message]) -> dict[str, Any]:
        return scenarios.chat_body(messages, model=self.model)

    def next_bodies(self) -> dict[str, bytes]:
        self._turn += 1
        self._added += [
            {"role": "assistant", "content": f"Answer {self._turn}: " + scenarios.prose(self._rng, 30)},
            {"role": "user", "content": f"Turn {self._turn}: " + scenarios.prose(self._rng, 40)},
        ]
        chat = self.chat_at([*self.base, *self._added])
        return {route.name: in_shape(route.name, chat) for route in ROUTES}


# ----------------------------------------------------------------------------- measuring (r)


def targets(direct_url: str, proxy_url: str) -> list[load.Target]:
    """``direct <route>`` (the fake upstream on that path) and ``proxy <route>`` for every route."""
    out = []
    for route in ROUTES:
        out.append(load.Target(f"direct {route.name}", direct_url, "upstream", route.path, route.headers))
        out.append(load.Target(f"proxy {route.name}", proxy_url, "proxy", route.path, route.headers))
    return out


def small_bodies() -> dict[str, bytes]:
    return {route.path: small(route.name) for route in ROUTES}


async def measure(
    session: Any,
    *,
    direct_url: str,
    proxy_url: str,
    small_iterations: int,
    session_tokens: int,
    session_iterations: int,
    requests: int,
    concurrency: int,
    rounds: int,
    time_limit_s: float,
    cpu_of: load.CpuReader,
    notes: list[str],
) -> dict[str, Any]:
    """Scenario (r): the small request and the resent large session on every route (all eight
    targets interleaved every iteration), then ``requests`` small requests per route at ``concurrency``.

    Returns ``{"small": samples, "session": samples, "throughput": samples, "fitted": {...}}``
    (samples by target name); ``fitted[route]`` is False when the proxy answered that route
    without ``X-Context-*`` headers, i.e. passed it through instead of fitting it.
    """
    everything = targets(direct_url, proxy_url)
    bodies = small_bodies()
    small_samples, cut = await load.run_interleaved(
        session,
        everything,
        lambda i: bodies,
        iterations=small_iterations,
        time_limit_s=time_limit_s,
        warmup=10,
        cpu_of=cpu_of,
        cpu_per_request=True,
    )
    if cut:
        notes.append("(r) small: stopped at its time limit")
    route_session = RouteSession(session_tokens)

    def session_bodies(i: int) -> dict[str, bytes]:
        return {BY_NAME[name].path: raw for name, raw in route_session.next_bodies().items()}

    session_samples, cut = await load.run_interleaved(
        session,
        everything,
        session_bodies,
        iterations=session_iterations,
        time_limit_s=time_limit_s,
        warmup=2,
        cpu_of=cpu_of,
        cpu_per_request=True,
    )
    if cut:
        notes.append("(r) session: stopped at its time limit")
    proxies = [t for t in everything if t.server == "proxy"]
    async with load.new_session(limit=0) as fresh:
        throughput, cut = await load.run_concurrent_rounds(
            fresh,
            proxies,
            bodies,
            requests=requests,
            concurrency=concurrency,
            rounds=rounds,
            time_limit_s=time_limit_s * 2,
            cpu_of=cpu_of,
        )
    if cut:
        notes.append("(r) concurrency: stopped at its time limit")
    fitted = {
        route.name: bool(small_samples[f"proxy {route.name}"].last_headers)
        and bool(session_samples[f"proxy {route.name}"].last_headers)
        for route in ROUTES
    }
    for name, ok in fitted.items():
        if not ok:
            notes.append(
                f"(r) the proxy answered {name} without X-Context-* headers: passed through, not fitted"
            )
    return {"small": small_samples, "session": session_samples, "throughput": throughput, "fitted": fitted}


# ----------------------------------------------------------------------------- reporting (r)


def added(stats: Mapping[str, Mapping[str, Any]], route: str, key: str) -> float:
    """The proxy's added latency on ``route``: proxy minus direct on the same path, same run."""
    proxy, direct = stats.get(f"proxy {route}"), stats.get(f"direct {route}")
    if proxy is None or direct is None:
        return math.nan
    return float(proxy[key]) - float(direct[key])


def _ratio(a: float, b: float) -> float:
    return a / b if b and not (math.isnan(a) or math.isnan(b)) else math.nan


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def markdown(block: Mapping[str, Any]) -> list[str]:
    """The (r) tables: added latency per route beside chat's, then requests/s per route."""
    lines: list[str] = []
    for key, title in (("small", "small fitting request"), ("session", "~100K-token session, resent")):
        stats = block.get(key, {}).get("stats", {})
        if not stats:
            continue
        lines += [
            "",
            f"### (r) {title}: the same request on every route",
            "",
            "| route | direct p50 ms | proxy p50 ms | added p50 / p95 ms | added p50 / chat's |"
            " proxy CPU ms/req | CPU / chat's |",
            "|---|---|---|---|---|---|---|",
        ]
        chat = added(stats, "chat", "p50_ms")
        chat_cpu = stats.get("proxy chat", {}).get("cpu_ms_per_req")
        for route in ROUTES:
            if f"proxy {route.name}" not in stats:
                continue
            a50, a95 = added(stats, route.name, "p50_ms"), added(stats, route.name, "p95_ms")
            cpu = stats[f"proxy {route.name}"].get("cpu_ms_per_req")
            cpu_ratio = _ratio(cpu, chat_cpu) if cpu is not None and chat_cpu is not None else math.nan
            lines.append(
                f"| {route.path} | {_f(stats[f'direct {route.name}']['p50_ms'])} |"
                f" {_f(stats[f'proxy {route.name}']['p50_ms'])} | {_f(a50)} / {_f(a95)} |"
                f" {_f(_ratio(a50, chat))}x | {_f(cpu, 3)} | {_f(cpu_ratio)}x |"
            )
    tp = block.get("throughput", {}).get("stats", {})
    if tp:
        lines += [
            "",
            "### (r) small requests at concurrency, per route (proxy only)",
            "",
            "| route | requests | errors | req/s: median of rounds (x chat's) |"
            " req/s: all rounds (x chat's) | p50 ms | p99 ms | server CPU ms/req |",
            "|---|---|---|---|---|---|---|---|",
        ]
        chat = tp.get("proxy chat", {})
        for route in ROUTES:
            s = tp.get(f"proxy {route.name}")
            if s is None:
                continue
            rounds, whole = rps_of(s), s["rps"]
            lines.append(
                f"| {route.path} | {s['n']} | {s['errors']} |"
                f" {_f(rounds, 0)} ({_f(_ratio(rounds, rps_of(chat)))}x) |"
                f" {_f(whole, 0)} ({_f(_ratio(whole, chat.get('rps', math.nan)))}x) |"
                f" {_f(s['p50_ms'])} | {_f(s['p99_ms'])} | {_f(s.get('cpu_ms_per_req'), 3)} |"
            )
    if block.get("note"):
        lines += ["", block["note"]]
    return lines


def checks(block: Mapping[str, Any]) -> list[tuple[str, bool | None, str]]:
    """Acceptance of the new routes: added latency (p50) and requests/s within 10% of chat's."""
    out: list[tuple[str, bool | None, str]] = []
    fitted = block.get("fitted", {})
    for key, title in (("small", "small"), ("session", "session")):
        stats = block.get(key, {}).get("stats", {})
        chat = added(stats, "chat", "p50_ms")
        for route in ROUTES[1:]:
            if f"proxy {route.name}" not in stats:
                continue
            mine = added(stats, route.name, "p50_ms")
            ok = None if not fitted.get(route.name, True) else mine <= 1.10 * chat
            out.append(
                (
                    f"(r) {title}: {route.path} added p50 <= 1.1x chat's",
                    ok,
                    f"{mine:.2f} ms vs {chat:.2f} ms ({_ratio(mine, chat):.2f}x)",
                )
            )
    tp = block.get("throughput", {}).get("stats", {})
    chat = tp.get("proxy chat", {})
    chat_rps = rps_of(chat)
    for route in ROUTES[1:]:
        s = tp.get(f"proxy {route.name}")
        if s is None:
            continue
        r = _ratio(rps_of(s), chat_rps)
        whole = _ratio(s["rps"], chat.get("rps", math.nan))
        ok = None if not fitted.get(route.name, True) else r >= 0.90
        detail = f"{rps_of(s):.0f} vs {chat_rps:.0f} ({r:.2f}x; all rounds {whole:.2f}x)"
        out.append((f"(r) {route.path} req/s >= 0.9x chat's (median of rounds)", ok, detail))
    return out


def rps_of(stats: Mapping[str, Any]) -> float:
    """A route's requests/s at concurrency: the median of its rounds' (``rps_rounds``), else its
    requests over all rounds' time. The rounds alternate the routes; a batch that shared the two
    cores with something else (the harness's own client, another process) swung the all-rounds
    figure between 0.74x and 1.13x chat's from run to run of the same build."""
    value = stats.get("rps_rounds")
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return float(stats.get("rps", math.nan))
    return float(value)
