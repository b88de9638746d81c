"""Classify upstream context-length errors: structure first, precise text second.

INTERFACE CONTRACT:

* ``ContextOverflow`` (frozen): ``dialect`` (``"openai"``, ``"anthropic"``, ``"vllm"``,
  ``"llamacpp"``, ``"sglang"``, ``"tgi"``, ``"lmstudio"``, ``"xai"``, ``"groq"``, ``"mistral"``,
  ``"bedrock"``, ``"openrouter"``, ``"google"``, ``"moonshot"``, ``"ollama"``: a best-effort label for
  logs and metrics, never a switch), ``limit_tokens`` (the window the upstream states, or None),
  ``prompt_tokens`` (the upstream's own count of our prompt, or None), ``requested_tokens``
  (prompt + requested output when the upstream states both, or None), ``output_tokens`` (the
  output the upstream counted against ``limit_tokens``, or None), ``message`` (the upstream text),
  ``prompt_at_least`` (True when ``prompt_tokens`` is only a lower bound: vLLM stops tokenizing
  one token past the input room and says "at least").
* ``classify_overflow(status: int, body: bytes | str | Mapping | None) -> ContextOverflow | None``.
  Never raises, whatever the body.

When the stated limit is an *input* limit (xAI "maximum prompt length", Gemini "input token
count", TGI "`inputs` must have less than", OpenAI "Input tokens exceed the configured limit"),
``output_tokens`` is 0: nothing else counts against that limit, so the retry sizing must not
subtract an output reserve from it a second time.

What is never an overflow: 401/402/403/404/429 of any wording; a 5xx unless its structure says so
(llama.cpp ``exceed_context_size_error``, OpenAI ``context_length_exceeded``); rate limits that
mention tokens (OpenAI "tokens per min (TPM)", Bedrock "Too many tokens, please wait"); ``max_tokens``
limits on the output alone; payload-size 413s; HTML error pages.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

_MAX_DEPTH = 4
_MAX_BODY_CHARS = 1_000_000

_NEVER_STATUSES = frozenset({401, 402, 403, 404, 405, 407, 429})
_OVERFLOW_CODES = frozenset({"context_length_exceeded"})
_LLAMACPP_TYPE = "exceed_context_size_error"
_NOT_OVERFLOW_CODES = frozenset(
    {"rate_limit_exceeded", "insufficient_quota", "invalid_api_key", "tokens", "request_too_large"}
)
# Rate limits and throttles speak of tokens and limits too; they are checked before any overflow
# wording so "Request too large ... on tokens per min (TPM): Limit 30000, Requested 50000" stays a
# rate limit even on a 400 or 413.
_NOT_OVERFLOW_TEXT = re.compile(
    r"tokens per min(?:ute)?\b|\(TPM\)|\brate[ _-]?limit|too many tokens, please wait|throttl",
    re.IGNORECASE,
)

_N = r"\d[\d,]*(?:\.\d+)?"


@dataclass(frozen=True, slots=True)
class ContextOverflow:
    """One upstream context-length refusal and the numbers it stated (see the module contract)."""

    dialect: str
    limit_tokens: int | None = None
    prompt_tokens: int | None = None
    requested_tokens: int | None = None
    output_tokens: int | None = None
    message: str = ""
    prompt_at_least: bool = False


@dataclass(frozen=True, slots=True)
class _Pattern:
    dialect: str
    regex: re.Pattern[str]
    # Wording several servers share: a structural hint (the JSON's type/code) names the dialect.
    shared: bool = False
    # The limit it states is an input limit: nothing else counts against it.
    input_limit: bool = False


def _p(dialect: str, pattern: str, *, shared: bool = False, input_limit: bool = False) -> _Pattern:
    return _Pattern(dialect, re.compile(pattern.replace("{N}", _N)), shared, input_limit)


# Most specific first: the first pattern that matches wins. Named groups: limit, prompt, output,
# requested, atleast, parts (OpenRouter's breakdown). Sources are cited in tests/core/overflow_bodies.py.
_PATTERNS: tuple[_Pattern, ...] = (
    # vLLM >= 0.16 (vllm/renderers/params.py TokenizeParams._token_len_check).
    _p(
        "vllm",
        r"You passed (?P<prompt>{N}) input tokens and requested (?P<output>{N}) output tokens\. "
        r"However, the model's context length is only (?P<limit>{N}) tokens",
    ),
    # vLLM >= 0.16, text rejected before tokenizing: a character count, not a token count.
    _p(
        "vllm",
        r"You passed {N} input characters and requested (?P<output>{N}) output tokens\. "
        r"However, the model's context length is only (?P<limit>{N}) tokens",
    ),
    # vLLM renderer, later wording ("your prompt contains [at least] P input tokens").
    _p(
        "vllm",
        r"maximum context length is (?P<limit>{N}) tokens\. However, you requested (?P<output>{N}) "
        r"output tokens and your prompt contains (?P<atleast>at least )?(?P<prompt>{N}) input tokens",
    ),
    _p(
        "vllm",
        r"maximum context length is (?P<limit>{N}) tokens\. However, you requested (?P<output>{N}) "
        r"output tokens and your prompt contains {N} characters",
    ),
    # vLLM serving_engine._validate_input: prompt fits, prompt + max_tokens does not.
    _p(
        "vllm",
        r"'max_tokens' or 'max_completion_tokens' is too large: (?P<output>{N})\. This model's maximum "
        r"context length is (?P<limit>{N}) tokens and your request has (?P<prompt>{N}) input tokens",
    ),
    _p(
        "vllm",
        r"This model's maximum context length is (?P<limit>{N}) tokens\. However, your request has "
        r"(?P<prompt>{N}) input tokens(?: plus (?P<output>{N}) 'max_tokens')?",
    ),
    # Old vLLM and old OpenAI (and DeepSeek): prompt and completion spelled out.
    _p(
        "vllm",
        r"maximum context length is (?P<limit>{N}) tokens\. However, you requested (?P<requested>{N}) "
        r"tokens \((?P<prompt>{N}) in the messages, (?P<output>{N}) in the completion\)",
        shared=True,
    ),
    _p(
        "vllm",
        r"maximum context length is (?P<limit>{N}) tokens\. However, you requested (?P<prompt>{N}) "
        r"tokens in the messages",
    ),
    # vLLM engine input processor.
    _p(
        "vllm",
        r"The decoder prompt \(length (?P<prompt>{N})\) (?:plus the number of requested output tokens "
        r"\(at least 1\) )?is longer than the maximum model length of (?P<limit>{N})",
    ),
    # OpenAI chat completions.
    _p(
        "openai",
        r"This model's maximum context length is (?P<limit>{N}) tokens\. However, your messages "
        r"resulted in (?P<requested>{N}) tokens \((?P<prompt>{N}) in the messages, (?P<output>{N}) in "
        r"the completion\)",
        shared=True,
    ),
    _p(
        "openai",
        r"This model's maximum context length is (?P<limit>{N}) tokens\. However, your messages "
        r"resulted in (?P<prompt>{N}) tokens",
        shared=True,
    ),
    _p(
        "openai",
        r"Input tokens exceed the configured limit of (?P<limit>{N}) tokens\. Your messages resulted "
        r"in (?P<prompt>{N}) tokens",
        input_limit=True,
    ),
    _p("openai", r"Your input exceeds the context window of this model"),
    # Anthropic (and Anthropic on Bedrock / Vertex).
    _p(
        "anthropic",
        r"input length and `max_tokens` exceed context limit: (?P<prompt>{N}) \+ (?P<output>{N}) > "
        r"(?P<limit>{N})",
    ),
    _p("anthropic", r"prompt is too long: (?P<prompt>{N}) tokens > (?P<limit>{N}) maximum"),
    # llama.cpp server (tools/server/server-context.cpp), newest to oldest.
    _p(
        "llamacpp",
        r"request \((?P<prompt>{N}) tokens\) exceeds the available context size \((?P<limit>{N}) tokens\)",
    ),
    _p(
        "llamacpp",
        r"input \((?P<prompt>{N}) tokens\) is larger than the max context size \((?P<limit>{N}) tokens\)",
    ),
    _p("llamacpp", r"the request exceeds the available context size"),
    # SGLang (and Together, which serves the same wording).
    _p(
        "sglang",
        r"Requested token count exceeds the model's maximum context length of (?P<limit>{N}) tokens\."
        r"(?: You requested a total of (?P<requested>{N}) tokens: (?P<prompt>{N}) tokens from the input "
        r"messages and (?P<output>{N}) tokens for the completion)?",
    ),
    _p(
        "sglang",
        r"The input \((?P<prompt>{N}) tokens\) is longer than the model's context length "
        r"\((?P<limit>{N}) tokens\)",
    ),
    # Hugging Face text-generation-inference (router/src/validation.rs).
    _p(
        "tgi",
        r"`inputs` tokens \+ `max_new_tokens` must be <= (?P<limit>{N})\.(?: Given: (?P<prompt>{N}) "
        r"`inputs` tokens and (?P<output>{N}) `max_new_tokens`)?",
    ),
    _p(
        "tgi",
        r"`inputs` must have less than (?P<limit>{N}) tokens\. Given: (?P<prompt>{N})",
        input_limit=True,
    ),
    # LM Studio.
    _p(
        "lmstudio",
        r"Trying to keep the first (?P<prompt>{N}) tokens when context the overflows\. However, the "
        r"model is loaded with context length of only (?P<limit>{N}) tokens",
    ),
    _p("lmstudio", r"tokens to keep from the initial prompt is greater than the context length"),
    # xAI: the limit is on the prompt alone.
    _p(
        "xai",
        r"This model's maximum prompt length is (?P<limit>{N}) but the request contains "
        r"(?P<prompt>{N}) tokens",
        input_limit=True,
    ),
    # Mistral.
    _p(
        "mistral",
        r"Prompt contains (?P<prompt>{N}) tokens(?: and {N} draft tokens)?, too large for model with "
        r"(?P<limit>{N}) maximum context length",
    ),
    # Amazon Bedrock.
    _p("bedrock", r"Input is too long for requested model"),
    # OpenRouter's own pre-flight check.
    _p(
        "openrouter",
        r"This endpoint's maximum context length is (?P<limit>{N}) tokens\. However, you requested "
        r"about (?P<requested>{N}) tokens(?: \((?P<parts>[^)]*)\))?",
    ),
    # Google's Gemini servers (native and OpenAI-compatible endpoints): the limit is on the input
    # alone. Labelled by the server, like "bedrock": the wire API's own name is the dialect's.
    _p(
        "google",
        r"The input token count \((?P<prompt>{N})\) exceeds the maximum number of tokens allowed "
        r"\((?P<limit>{N})\)",
        input_limit=True,
    ),
    _p(
        "moonshot",
        r"Your request exceeded model token limit: (?P<limit>{N}) \(requested: (?P<requested>{N})\)",
    ),
    _p("ollama", r"prompt too long; exceeded (?:max )?context length by {N} tokens"),
    # Groq / Cerebras / OpenAI's closing sentence, alone.
    _p("groq", r"Please reduce the length of the messages or completion", shared=True),
    # Any OpenAI-compatible server that states only the window.
    _p("openai", r"This model's maximum context length is (?P<limit>{N}) tokens", shared=True),
)

_OPENROUTER_PART = re.compile(r"({N}) (?:of [a-z]+ input|in the output)".replace("{N}", _N))


def classify_overflow(status: int, body: bytes | str | Mapping[str, object] | None) -> ContextOverflow | None:
    """The context overflow ``body`` reports, or None when it is anything else (never raises)."""
    try:
        return _classify(status, body, depth=0)
    except (ValueError, TypeError, RecursionError, OverflowError):
        return None


def _classify(status: object, body: object, *, depth: int) -> ContextOverflow | None:
    if not isinstance(status, int) or isinstance(status, bool) or status in _NEVER_STATUSES:
        return None
    if depth > _MAX_DEPTH:
        return None
    parsed = _parse(body)
    if parsed is None:
        return None
    if isinstance(parsed, str):
        # Plain text bodies: only a 4xx (or an in-stream 200) may carry overflow wording.
        if status >= 500:
            return None
        return _from_texts((parsed,), hint=None, status=status)
    return _from_json(status, parsed, depth=depth)


def _parse(body: object) -> str | Mapping[str, object] | list[object] | None:
    """A JSON object/array, a non-HTML text, or None."""
    if body is None:
        return None
    if isinstance(body, Mapping):
        return body
    if isinstance(body, list):
        return body
    if isinstance(body, bytes | bytearray | memoryview):
        text = bytes(body[:_MAX_BODY_CHARS]).decode("utf-8", errors="replace")
    elif isinstance(body, str):
        text = body[:_MAX_BODY_CHARS]
    else:
        return None
    stripped = text.strip()
    if not stripped or stripped.startswith("<"):
        return None
    # In-stream errors: ``data: {...}`` (SSE) or llama.cpp's ``error: {...}``.
    for prefix in ("data:", "error:"):
        if stripped.startswith(prefix):
            stripped = stripped[len(prefix) :].strip()
            break
    if stripped[:1] in ("{", "["):
        try:
            value = json.loads(stripped)
        except ValueError:
            return stripped
        if isinstance(value, dict | list):
            return value
        return None
    return stripped


def _from_json(
    status: int, value: Mapping[str, object] | list[object], *, depth: int
) -> ContextOverflow | None:
    if isinstance(value, list):
        for item in value[:8]:
            if isinstance(item, Mapping):
                found = _from_json(status, item, depth=depth + 1)
                if found is not None:
                    return found
        return None
    error = value.get("error")
    node: Mapping[str, object] = error if isinstance(error, Mapping) else value
    code = node.get("code")
    kind = node.get("type")
    labels = {x for x in (code, kind, value.get("code"), value.get("type")) if isinstance(x, str)}
    if labels & _NOT_OVERFLOW_CODES:
        return None

    # OpenRouter wraps the provider's own body in error.metadata.raw.
    metadata = node.get("metadata")
    if isinstance(metadata, Mapping):
        raw = metadata.get("raw")
        if isinstance(raw, str | Mapping):
            inner = _classify(status, raw, depth=depth + 1)
            if inner is not None:
                return inner

    texts = tuple(_texts(value, depth=0))
    if kind == _LLAMACPP_TYPE:
        found = _from_texts(texts, hint="llamacpp", status=status)
        base = found or ContextOverflow(dialect="llamacpp", message=texts[0] if texts else "")
        return _with_llamacpp_fields(base, node)
    if labels & _OVERFLOW_CODES:
        found = _from_texts(texts, hint="openai", status=status)
        return found or ContextOverflow(dialect="openai", message=texts[0] if texts else "")
    if status >= 500:
        return None
    return _from_texts(texts, hint=None, status=status)


def _texts(value: object, *, depth: int) -> Iterator[str]:
    """The human-readable strings of an error body, in reading order, under known keys only."""
    if depth > _MAX_DEPTH:
        return
    if isinstance(value, str):
        yield value
        return
    if isinstance(value, list):
        for item in value[:8]:
            yield from _texts(item, depth=depth + 1)
        return
    if not isinstance(value, Mapping):
        return
    for key in ("message", "error", "detail", "msg", "errors", "details"):
        if key in value:
            yield from _texts(value[key], depth=depth + 1)


def _from_texts(texts: tuple[str, ...], *, hint: str | None, status: int) -> ContextOverflow | None:
    for text in texts:
        if _NOT_OVERFLOW_TEXT.search(text):
            return None
    for text in texts:
        for pattern in _PATTERNS:
            match = pattern.regex.search(text)
            if match is not None:
                return _build(pattern, match, text, hint=hint)
    return None


def _build(pattern: _Pattern, match: re.Match[str], text: str, *, hint: str | None) -> ContextOverflow:
    groups = match.groupdict()
    limit = _positive(_number(groups.get("limit")))
    prompt = _positive(_number(groups.get("prompt")))
    output = _number(groups.get("output"))
    requested = _positive(_number(groups.get("requested")))
    parts = groups.get("parts")
    if parts:
        prompt, output = _openrouter_parts(parts)
    if pattern.input_limit:
        output = 0
    if requested is None and prompt is not None and output is not None and not pattern.input_limit:
        requested = prompt + output
    dialect = hint if pattern.shared and hint is not None else pattern.dialect
    return ContextOverflow(
        dialect=dialect,
        limit_tokens=limit,
        prompt_tokens=prompt,
        requested_tokens=requested,
        output_tokens=output,
        message=text,
        prompt_at_least=bool(groups.get("atleast")),
    )


def _openrouter_parts(parts: str) -> tuple[int | None, int | None]:
    """``"220500 of text input, 824 of tool input, 32000 in the output"`` -> (221324, 32000)."""
    prompt: int | None = None
    output: int | None = None
    for match in _OPENROUTER_PART.finditer(parts):
        value = _number(match.group(1))
        if value is None:
            continue
        if match.group(0).endswith("in the output"):
            output = value
        else:
            prompt = value if prompt is None else prompt + value
    return _positive(prompt), output


def _with_llamacpp_fields(found: ContextOverflow, node: Mapping[str, object]) -> ContextOverflow:
    prompt = _int_field(node.get("n_prompt_tokens"))
    limit = _int_field(node.get("n_ctx"))
    return ContextOverflow(
        dialect="llamacpp",
        limit_tokens=limit if limit is not None else found.limit_tokens,
        prompt_tokens=prompt if prompt is not None else found.prompt_tokens,
        requested_tokens=found.requested_tokens,
        output_tokens=found.output_tokens,
        message=found.message,
        prompt_at_least=found.prompt_at_least,
    )


def _int_field(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _number(text: str | None) -> int | None:
    if not text:
        return None
    return int(float(text.replace(",", "")))


def _positive(value: int | None) -> int | None:
    return value if value is not None and value > 0 else None
