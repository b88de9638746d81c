"""Every registered wire API through one real proxy, for the observability e2e tests.

Each API's strict fake upstream runs on its own 127.0.0.1 server (:mod:`tests.fake_upstream`,
:mod:`tests.fake_responses_upstream`, :mod:`tests.fake_anthropic_upstream`,
:mod:`tests.fake_gemini_upstream`); one ctxproxy
(``serve_proxy``) sends each API's model to that API's fake through ``CTXPROXY_UPSTREAM_ROUTES``
(model name -> base URL) and knows every window from one operator model table.

:data:`SAMPLES` holds one :class:`ApiSample` per registered dialect name: how to start its fake,
its model, and how its official SDK sends a request (short or long, streamed or not, with extra
headers) and asks the API's counting endpoint. **A new wire API plugs in here**: add its entry to
:data:`SAMPLES` (Gemini's: its strict fake and the ``google-genai`` SDK; its requests go to the
client's own ``/v1beta`` path at the origin of the routed base URL); the tests iterate
``app.core.dialects.DIALECTS`` and fail for a dialect with no sample.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anthropic
import httpx
import openai
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from tests.fake_anthropic_upstream import FakeAnthropic, FakeClaude
from tests.fake_gemini_upstream import FakeGemini, FakeGeminiModel
from tests.fake_responses_upstream import FakeResponsesUpstream
from tests.fake_upstream import FakeModel, FakeUpstream, serve_proxy

WINDOW_TOKENS = 4096
MAX_OUTPUT_TOKENS = 512
TURN_WORDS = 120  # words per message of a conversation's turns
LONG_TURNS = 24  # turns that overflow every sample's window (about 2.5x)


@dataclass(frozen=True)
class Reply:
    """What the client got: the status and the response headers (lower-case names)."""

    status: int
    headers: Mapping[str, str]


class Send(Protocol):
    def __call__(
        self, url: str, *, turns: int, stream: bool = False, headers: Mapping[str, str] | None = None
    ) -> Reply: ...


@dataclass(frozen=True)
class ApiSample:
    """How one wire API is exercised: its fake upstream (a context manager yielding its root URL),
    its model (and the model table entry declaring its window), a request of ``turns``
    user/assistant turns through the API's official SDK (``url``: the proxy's root), and its
    counting endpoint (None: the API has none)."""

    model: str
    fake: Callable[[], AbstractContextManager[str]]
    toml: str
    send: Send
    count: Callable[[str], Reply] | None = None


def words(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def turns_of(turns: int) -> list[tuple[str, str]]:
    """``turns`` (user, assistant) pairs of ``TURN_WORDS`` words each."""
    return [
        (f"question {k}: " + words(TURN_WORDS, f"u{k}w"), words(TURN_WORDS, f"a{k}w")) for k in range(turns)
    ]


def table_entry(model: str, encoding: str) -> str:
    return (
        f'[models."{model}"]\nwindow = {WINDOW_TOKENS}\nmax_output = {MAX_OUTPUT_TOKENS}\n'
        f'encoding = "{encoding}"\n'
    )


def _headers(response: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in response.headers.items()}


def _openai(url: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{url}/v1", api_key="test", max_retries=0, http_client=httpx.Client(timeout=60)
    )


def _raw_reply(call: Callable[[], Any], *, stream: bool, errors: type[Exception]) -> Reply:
    """Make an SDK ``with_raw_response`` call, read the answer (every event of a stream) and
    return its status and headers; an API error is a reply too."""
    try:
        raw = call()
    except errors as exc:
        response = exc.response  # type: ignore[attr-defined]
        return Reply(response.status_code, _headers(response))
    parsed = raw.parse()
    if stream:
        for _event in parsed:
            pass
    return Reply(raw.status_code, _headers(raw))


# ---- chat ---------------------------------------------------------------------------------------

CHAT_MODEL = "all-chat"


@contextmanager
def _chat_fake() -> Iterator[str]:
    fake = FakeUpstream([FakeModel(CHAT_MODEL, WINDOW_TOKENS, max_output_tokens=MAX_OUTPUT_TOKENS)])
    with fake.serve() as url:
        yield url


def _chat_send(
    url: str, *, turns: int, stream: bool = False, headers: Mapping[str, str] | None = None
) -> Reply:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Answer briefly."}]
    for user, assistant in turns_of(turns):
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    messages.append({"role": "user", "content": "What was the last question?"})
    with _openai(url) as client:
        create = client.chat.completions.with_raw_response.create
        return _raw_reply(
            lambda: create(
                model=CHAT_MODEL, messages=messages, stream=stream, extra_headers=dict(headers or {})
            ),
            stream=stream,
            errors=openai.APIStatusError,
        )


# ---- responses ----------------------------------------------------------------------------------

RESPONSES_MODEL = "all-responses"


@contextmanager
def _responses_fake() -> Iterator[str]:
    fake = FakeResponsesUpstream(
        [FakeModel(RESPONSES_MODEL, WINDOW_TOKENS, max_output_tokens=MAX_OUTPUT_TOKENS)]
    )
    with fake.serve() as url:
        yield url


def _responses_input(turns: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for user, assistant in turns_of(turns):
        items += [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": user}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": assistant}]},
        ]
    return [*items, {"type": "message", "role": "user", "content": "What was the last question?"}]


def _responses_send(
    url: str, *, turns: int, stream: bool = False, headers: Mapping[str, str] | None = None
) -> Reply:
    items = _responses_input(turns)
    with _openai(url) as client:
        create = client.responses.with_raw_response.create
        return _raw_reply(
            lambda: create(
                model=RESPONSES_MODEL,
                input=items,
                store=False,
                stream=stream,
                extra_headers=dict(headers or {}),
            ),
            stream=stream,
            errors=openai.APIStatusError,
        )


def _responses_count(url: str) -> Reply:
    with _openai(url) as client:
        count = client.responses.input_tokens.with_raw_response.count
        return _raw_reply(
            lambda: count(model=RESPONSES_MODEL, input=_responses_input(2)),
            stream=False,
            errors=openai.APIStatusError,
        )


# ---- messages -----------------------------------------------------------------------------------

MESSAGES_MODEL = "all-messages"


@contextmanager
def _messages_fake() -> Iterator[str]:
    fake = FakeAnthropic([FakeClaude(MESSAGES_MODEL, window_tokens=WINDOW_TOKENS)])
    with fake.serve() as url:
        yield url


def _anthropic(url: str) -> anthropic.Anthropic:
    http = anthropic.DefaultHttpxClient(timeout=60)
    return anthropic.Anthropic(base_url=url, api_key="test", max_retries=0, http_client=http)


def _messages_of(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for user, assistant in turns_of(turns):
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return [*messages, {"role": "user", "content": "What was the last question?"}]


def _messages_send(
    url: str, *, turns: int, stream: bool = False, headers: Mapping[str, str] | None = None
) -> Reply:
    messages = _messages_of(turns)
    with _anthropic(url) as client:
        create = client.messages.with_raw_response.create
        return _raw_reply(
            lambda: create(
                model=MESSAGES_MODEL,
                max_tokens=MAX_OUTPUT_TOKENS,
                system="Answer briefly.",
                messages=messages,  # type: ignore[arg-type]
                stream=stream,
                extra_headers=dict(headers or {}),
            ),
            stream=stream,
            errors=anthropic.APIStatusError,
        )


def _messages_count(url: str) -> Reply:
    with _anthropic(url) as client:
        count = client.messages.with_raw_response.count_tokens
        return _raw_reply(
            lambda: count(model=MESSAGES_MODEL, messages=_messages_of(2)),  # type: ignore[arg-type]
            stream=False,
            errors=anthropic.APIStatusError,
        )


# ---- gemini -------------------------------------------------------------------------------------

GEMINI_MODEL = "all-gemini"


@contextmanager
def _gemini_fake() -> Iterator[str]:
    model = FakeGeminiModel(
        GEMINI_MODEL, input_token_limit=WINDOW_TOKENS, output_token_limit=MAX_OUTPUT_TOKENS
    )
    with FakeGemini([model]).serve() as url:
        yield url


@contextmanager
def _gemini(url: str, headers: Mapping[str, str] | None = None) -> Iterator[genai.Client]:
    http = httpx.Client(timeout=60)
    try:
        options = genai_types.HttpOptions(
            base_url=url,
            headers=dict(headers or {}),
            httpx_client=http,
            retry_options=genai_types.HttpRetryOptions(attempts=1),
        )
        yield genai.Client(api_key="test", http_options=options)
    finally:
        http.close()


def _gemini_contents(turns: int) -> list[genai_types.Content]:
    contents: list[genai_types.Content] = []
    for user, model in turns_of(turns):
        contents += [
            genai_types.Content(role="user", parts=[genai_types.Part(text=user)]),
            genai_types.Content(role="model", parts=[genai_types.Part(text=model)]),
        ]
    last = genai_types.Content(role="user", parts=[genai_types.Part(text="What was the last question?")])
    return [*contents, last]


def _gemini_reply(answer: Any) -> Reply:
    http = answer.sdk_http_response
    return Reply(200, {k.lower(): v for k, v in (http.headers or {}).items()})


def _gemini_send(
    url: str, *, turns: int, stream: bool = False, headers: Mapping[str, str] | None = None
) -> Reply:
    config = genai_types.GenerateContentConfig(system_instruction="Answer briefly.")
    contents = _gemini_contents(turns)
    with _gemini(url, headers) as client:
        try:
            if not stream:
                return _gemini_reply(
                    client.models.generate_content(model=GEMINI_MODEL, contents=contents, config=config)
                )
            chunks = list(
                client.models.generate_content_stream(model=GEMINI_MODEL, contents=contents, config=config)
            )
            return _gemini_reply(chunks[-1])
        except genai_errors.APIError as exc:
            return Reply(exc.code, _headers(exc.response))


def _gemini_count(url: str) -> Reply:
    with _gemini(url) as client:
        return _gemini_reply(client.models.count_tokens(model=GEMINI_MODEL, contents=_gemini_contents(2)))


# ---- the registry of samples: one per wire API ----------------------------------------------------

SAMPLES: dict[str, ApiSample] = {
    "chat": ApiSample(CHAT_MODEL, _chat_fake, table_entry(CHAT_MODEL, "o200k_base"), _chat_send),
    "responses": ApiSample(
        RESPONSES_MODEL,
        _responses_fake,
        table_entry(RESPONSES_MODEL, "o200k_base"),
        _responses_send,
        _responses_count,
    ),
    "messages": ApiSample(
        MESSAGES_MODEL,
        _messages_fake,
        table_entry(MESSAGES_MODEL, "estimate"),
        _messages_send,
        _messages_count,
    ),
    "gemini": ApiSample(
        GEMINI_MODEL,
        _gemini_fake,
        table_entry(GEMINI_MODEL, "estimate"),
        _gemini_send,
        _gemini_count,
    ),
}


@dataclass(frozen=True)
class AllApis:
    """The running proxy (``url``: its root) in front of every sample's fake."""

    url: str
    samples: Mapping[str, ApiSample]


@contextmanager
def serve_all_apis(names: list[str], tmp_path: Path, **settings: Any) -> Iterator[AllApis]:
    """One proxy in front of the fakes of the APIs ``names`` (each must have a sample)."""
    missing = [name for name in names if name not in SAMPLES]
    assert not missing, f"no e2e sample for the wire API(s) {missing}: add one to SAMPLES in {__file__}"
    samples = {name: SAMPLES[name] for name in names}
    table = tmp_path / "models.toml"
    table.write_text("\n".join(s.toml for s in samples.values()), encoding="utf-8")
    with ExitStack() as stack:
        roots = {name: stack.enter_context(s.fake()) for name, s in samples.items()}
        routes = {samples[name].model: f"{root}/v1" for name, root in roots.items()}
        default = next(iter(roots.values()))
        url = stack.enter_context(
            serve_proxy(default, models_file=table, upstream_routes=routes, discovery=False, **settings)
        )
        yield AllApis(url=url, samples=samples)
