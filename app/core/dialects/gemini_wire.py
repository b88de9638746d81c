"""Gemini ``contents`` as neutral messages and back, and the structural rules of a Gemini body.

INTERFACE CONTRACT (``gemini.py`` builds the dialect on these; pure, standard library only):

* ``field(mapping, name)``: a field by its lowerCamelCase name, or by its snake_case spelling
  (Gemini's REST API accepts both: ``systemInstruction``/``system_instruction``, ...);
  ``key_of(mapping, name)``: which of the two spellings the mapping uses (``name`` when neither);
* ``neutral_messages(contents, system) -> list[dict]``: the neutral messages of validated
  ``contents`` (and the ``systemInstruction`` content, or None) by the mapping below; they are
  ``system_message(system)`` (None for a system instruction without parts) followed by
  ``content_messages(i, contents[i], contents[i - 1] or None)`` for each content, a pure
  function of those three (what a resent history's parse reuses);
* ``render_contents(body, messages, *, source=None) -> dict``: ``body`` with ``contents`` (and the
  system instruction when it changed) rebuilt from fitted neutral messages; ``source`` (the
  parse's own messages) lets every unchanged message be written back without comparing it;
* ``wire_problems(body) -> list[str]``: the rules below that ``body`` breaks, sorted, each once,
  worded without positions;
* ``pair_responses(calls, responses)``: which call each function response answers (the pairing
  rule below); ``SYSTEM_INDEX`` (-1), the origin index of the system instruction.

Mapping (origins are ``[i, k]`` = part ``k`` of ``contents[i]``, ``[-1, k]`` = part ``k`` of the
system instruction, ``[i]`` = the whole of a content with no parts):

* the system instruction -> one pinned ``system`` message, one neutral part per wire part;
* a ``user`` content (or one without a role): each ``functionResponse`` part -> a ``tool`` message
  (``tool_call_id`` = the id of the call it answers, ``name`` = the function's); its other parts ->
  one ``user`` message; so a content holding only function responses does not start a turn;
* a ``model`` content -> one ``assistant`` message: ``functionCall`` parts become ``tool_calls``
  (neutral ids ``c{i}.{k}``, arguments = the JSON of ``args``), the other parts its content;
* pairing: a user content's function responses answer the calls of the model content right
  before it, by ``id`` when both the call and the response carry one, else by function name in
  order; a response that answers nothing gets an id no call has (an orphan the engine sees);
* neutral parts: ``text`` -> a text part (a content or system instruction that is one text part
  and nothing else has that string as its content); a thought (``thought: true``) -> a ``thinking`` part
  (counted, never cut); ``inlineData``/``fileData`` -> an ``image`` or ``media`` part priced by
  ``gemini_media`` (``PRICE_KEY``); every other part (``executableCode``, ...) -> its values as
  text; a ``thoughtSignature`` -> a priced ``signature`` part besides its part;
* a function response's neutral content is the string value of a one-key ``response``
  (gemini-cli sends ``{"output": ...}`` or ``{"error": ...}``), else the JSON of ``response``;
  nested multimodal ``parts`` (Gemini 3) follow it as priced parts;
* **signed parts are opaque**: a content with a ``thoughtSignature`` on any part, or a thought
  part, becomes an opaque message (kept byte-identical or dropped whole with its unit, never
  edited). Function responses are not signed: the engine may prune or cut them, as gemini-cli's
  own tool-output masking does next to signed calls. So the current turn's signatures are never
  stripped or edited: a signed step is either sent exactly as the model made it or not at all.

Rendering: a kept message is written back as its original parts (the same objects); a changed
text keeps every other key of its part (``{**part, "text": ...}``); an image the engine replaced
by a placeholder becomes a text part; a changed function response keeps ``id``, ``name`` and the
rest of its part, with ``response`` = ``{key: text}`` for a one-key response, else
``{"output": text}``, and no nested parts when the whole result was replaced. The parts of one
content are written in their original order; a content whose parts are all kept is the original
content object. A note or summary of the engine becomes a user text part; in a content holding
function responses it goes before them (Gemini 3 refuses any part after a content's function
responses: "Requests ending with a model turn are not supported.", a text before them is accepted;
``docs/gemini.md``). Adjacent contents of one role are merged (a model content holding signed
parts is never merged: a separator user content goes between), and when the output would open
with a model content and the input did not, a separator user content goes first; so roles
alternate and the first content is the user's.

Structural rules (``wire_problems``): ``contents`` is a non-empty list of objects; every content
has parts and a role of ``user`` or ``model`` (or none, or empty); the first content is a user content; no
two adjacent contents of one role; every function call of a model content is answered by the
next content (a user content) and every function response answers a call of the content just
before; no part other than a function response follows the first function response of a content;
in a request that carries thought signatures, the first function call of every model
content of the current turn (after the newest user content with text and no function response)
is signed, as Gemini 3 requires.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from functools import lru_cache
from typing import Any

from ..conversation import PRICE_KEY, Path, is_opaque, neutral, origin_of
from ..messages import Message
from .gemini_media import media_tokens, signature_tokens

SYSTEM_INDEX = -1
SEPARATOR_TEXT = "[ctxproxy: earlier messages were removed here to fit the context window]"
# Parts carrying these keys are the model's own reasoning: their content is opaque.
_SIGNATURE = "thoughtSignature"
_PAYLOAD_KEYS = ("functionCall", "functionResponse", "inlineData", "fileData")

Key = tuple[int, int, int]
# The snake_case spellings of the fields read most (``field``: one dict lookup, no regex).
_SNAKES: dict[str, str] = {
    "contents": "contents",
    "systemInstruction": "system_instruction",
    "generationConfig": "generation_config",
    "maxOutputTokens": "max_output_tokens",
    "generateContentRequest": "generate_content_request",
    "cachedContent": "cached_content",
    "tools": "tools",
    "functionCall": "function_call",
    "functionResponse": "function_response",
    "functionDeclarations": "function_declarations",
    "inlineData": "inline_data",
    "fileData": "file_data",
    "mimeType": "mime_type",
    "thoughtSignature": "thought_signature",
    "usageMetadata": "usage_metadata",
    "promptTokenCount": "prompt_token_count",
    "responseJsonSchema": "response_json_schema",
    "responseSchema": "response_schema",
    "parametersJsonSchema": "parameters_json_schema",
}


@lru_cache(maxsize=128)
def _snake(name: str) -> str:
    return re.sub(r"([A-Z])", r"_\1", name).lower()


def field(mapping: Mapping[str, Any], name: str) -> Any:
    """``mapping[name]`` by its lowerCamelCase name, else by its snake_case spelling, else None."""
    value = mapping.get(name)
    if value is None:
        snake = _SNAKES.get(name) or _snake(name)
        if snake != name:
            value = mapping.get(snake)
    return value


def plain_text(part: object) -> bool:
    """A part that is a text and nothing else (``{"text": "..."}``): the common case, decided
    without looking for any other field (it has none)."""
    return type(part) is dict and len(part) == 1 and type(part.get("text")) is str


def key_of(mapping: Mapping[str, Any], name: str) -> str:
    """The spelling of ``name`` that ``mapping`` uses (``name`` itself when it has neither)."""
    if name in mapping:
        return name
    snake = _snake(name)
    return snake if snake in mapping else name


def is_signed(part: object) -> bool:
    """True for a part whose content the model signed or that is the model's thought."""
    if plain_text(part) or not isinstance(part, Mapping):
        return False
    signature = field(part, _SIGNATURE)
    return (isinstance(signature, str) and signature != "") or part.get("thought") is True


def _role(content: Mapping[str, Any]) -> str:
    return "model" if content.get("role") == "model" else "user"


def _parts(content: object) -> list[Any]:
    parts = content.get("parts") if type(content) is dict or isinstance(content, Mapping) else None
    return parts if type(parts) is list else []


# -- neutral parts -----------------------------------------------------------------------------


def _is_text_part(part: object) -> bool:
    """A plain text part: a string ``text``, not a thought, no other payload."""
    return plain_text(part) or (
        isinstance(part, Mapping)
        and isinstance(part.get("text"), str)
        and part.get("thought") is not True
        and not any(field(part, k) is not None for k in _PAYLOAD_KEYS)
    )


def _media(part: Mapping[str, Any]) -> dict[str, Any] | None:
    inline = field(part, "inlineData")
    if isinstance(inline, Mapping):
        mime, data = field(inline, "mimeType"), inline.get("data")
    else:
        file = field(part, "fileData")
        if not isinstance(file, Mapping):
            return None
        mime, data = field(file, "mimeType"), None
    kind = "image" if isinstance(mime, str) and mime.lower().startswith("image/") else "media"
    return {"type": kind, PRICE_KEY: media_tokens(mime, data)}


def neutral_parts(part: object) -> list[dict[str, Any]]:
    """A wire part (not a function call or response) as neutral content parts: exactly one for an
    object, then a priced ``signature`` part when it is signed (a signed part is opaque)."""
    if plain_text(part):
        return [{"type": "text", "text": part["text"]}]  # type: ignore[index]
    if not isinstance(part, Mapping):
        return [{"type": "text", "text": part}] if isinstance(part, str) else []
    out: list[dict[str, Any]]
    if _is_text_part(part):
        out = [{"type": "text", "text": part["text"]}]
    elif part.get("thought") is True:
        text = part.get("text")
        out = [{"type": "thinking", "thinking": text if isinstance(text, str) else ""}]
    else:
        media = _media(part)
        if media is not None:
            out = [media]
        else:
            # One neutral part per wire part, even an empty one: render maps them back in order.
            rest = {k: v for k, v in part.items() if k not in (_SIGNATURE, _snake(_SIGNATURE))}
            out = [{"type": "part", "value": rest}]
    price = signature_tokens(field(part, _SIGNATURE))
    if price:
        out.append({"type": "signature", PRICE_KEY: price})
    return out


def _signature_parts(part: object) -> list[dict[str, Any]]:
    price = signature_tokens(field(part, _SIGNATURE)) if isinstance(part, Mapping) else 0
    return [{"type": "signature", PRICE_KEY: price}] if price else []


def response_content(response_part: Mapping[str, Any]) -> tuple[object, str | None]:
    """A function response's neutral content, and the key of its one-key string ``response``."""
    response = response_part.get("response")
    key: str | None = None
    if isinstance(response, Mapping) and len(response) == 1:
        only, value = next(iter(response.items()))
        if isinstance(value, str):
            text, key = value, str(only)
    if key is None:
        text = json.dumps(response, ensure_ascii=False, separators=(",", ":"))
    nested = response_part.get("parts")
    if isinstance(nested, list) and nested:
        extra = [p for item in nested for p in neutral_parts(item)]
        return [{"type": "text", "text": text}, *extra], key
    return text, key


def _arguments(call: Mapping[str, Any]) -> str:
    args = call.get("args")
    return json.dumps(args if args is not None else {}, ensure_ascii=False, separators=(",", ":"))


# -- pairing -----------------------------------------------------------------------------------


def pair_responses(
    calls: Sequence[tuple[str, str | None]], responses: Sequence[tuple[str, str | None]]
) -> list[int | None]:
    """For each response ``(name, id)``, the index of the call ``(name, id)`` it answers, or None:
    by id when both carry one, then the remaining ones by name in order."""
    taken = [False] * len(calls)
    out: list[int | None] = [None] * len(responses)
    by_id: dict[str, int] = {}
    for c, (_, call_id) in enumerate(calls):
        if call_id is not None:
            by_id.setdefault(call_id, c)
    for r, (_, response_id) in enumerate(responses):
        match = by_id.get(response_id) if response_id is not None else None
        if match is not None and not taken[match]:
            out[r], taken[match] = match, True
    for r, (name, response_id) in enumerate(responses):
        if out[r] is not None:
            continue
        for c, (call_name, call_id) in enumerate(calls):
            both_ids = call_id is not None and response_id is not None
            if not taken[c] and call_name == name and not both_ids:
                out[r], taken[c] = c, True
                break
    return out


def _id(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _calls_of(parts: Sequence[Any]) -> list[tuple[int, str, str | None]]:
    """``(part index, name, id)`` of every function call among ``parts``."""
    out = []
    for k, part in enumerate(parts):
        if plain_text(part):
            continue
        call = field(part, "functionCall") if isinstance(part, Mapping) else None
        if isinstance(call, Mapping):
            out.append((k, str(call.get("name")), _id(call.get("id"))))
    return out


def _responses_of(parts: Sequence[Any]) -> list[tuple[int, str, str | None]]:
    out = []
    for k, part in enumerate(parts):
        if plain_text(part):
            continue
        response = field(part, "functionResponse") if isinstance(part, Mapping) else None
        if isinstance(response, Mapping):
            out.append((k, str(response.get("name")), _id(response.get("id"))))
    return out


# -- parse -------------------------------------------------------------------------------------


def system_message(system: Mapping[str, Any]) -> dict[str, Any] | None:
    parts = _parts(system)
    if not parts:
        return None
    origin = [(SYSTEM_INDEX, k) for k in range(len(parts))]
    if len(parts) == 1 and plain_text(parts[0]):
        return neutral("system", parts[0]["text"], origin=origin)  # one text: a plain string
    content = [p for part in parts for p in neutral_parts(part)]
    return neutral("system", content, origin=origin, opaque=any(is_signed(p) for p in parts))


def neutral_messages(
    contents: Sequence[Mapping[str, Any]], system: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    """The neutral messages of validated ``contents`` (see the module docstring)."""
    out: list[dict[str, Any]] = []
    if system is not None:
        message = system_message(system)
        if message is not None:
            out.append(message)
    for i, content in enumerate(contents):
        out.extend(content_messages(i, content, contents[i - 1] if i else None))
    return out


def content_messages(
    index: int, content: Mapping[str, Any], previous: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    """The neutral messages of ``contents[index]`` (validated), ``previous`` the content before it
    (None for the first): a pure function of the three, so a parse may reuse them for a resent
    history whose contents up to ``index`` are strictly equal (``parse_memo``)."""
    i = index
    parts = _parts(content)
    if len(parts) == 1 and plain_text(parts[0]):
        # One text and nothing else (most contents): its neutral content is the string itself.
        role = "assistant" if _role(content) == "model" else "user"
        return [neutral(role, parts[0]["text"], origin=[(i, 0)])]
    signed = any(is_signed(p) for p in parts)
    if _role(content) == "model":
        calls_here = _calls_of(parts)
        call_at = {k for k, _, _ in calls_here}
        # A signed call is priced by its signature (the call itself by ``tool_calls``).
        body = [
            p
            for k, part in enumerate(parts)
            for p in (_signature_parts(part) if k in call_at else neutral_parts(part))
        ]
        origin: list[Path] = [(i, k) for k in range(len(parts))] or [(i,)]
        calls = [
            {
                "id": f"c{i}.{k}",
                "type": "function",
                "function": {"name": name, "arguments": _arguments(field(parts[k], "functionCall"))},
            }
            for k, name, _ in calls_here
        ]
        if calls:
            return [neutral("assistant", body, origin=origin, opaque=signed, tool_calls=calls)]
        return [neutral("assistant", body, origin=origin, opaque=signed)]
    out: list[dict[str, Any]] = []
    responses = _responses_of(parts)
    calls_before = _calls_of(_parts(previous)) if previous is not None and _role(previous) == "model" else []
    answered = pair_responses([(n, c) for _, n, c in calls_before], [(n, r) for _, n, r in responses])
    for (k, name, _), c in zip(responses, answered, strict=True):
        call_id = f"c{i - 1}.{calls_before[c][0]}" if c is not None else f"r{i}.{k}"
        text, _key = response_content(field(parts[k], "functionResponse"))
        out.append(neutral("tool", text, origin=[(i, k)], opaque=signed, tool_call_id=call_id, name=name))
    response_at = {k for k, _, _ in responses}
    rest = [k for k in range(len(parts)) if k not in response_at]
    if rest or not responses:
        user_body = [p for k in rest for p in neutral_parts(parts[k])]
        paths: list[Path] = [(i, k) for k in rest] or [(i,)]
        out.append(neutral("user", user_body, origin=paths, opaque=signed))
    return out


# -- render ------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Seg:
    """One output content under construction; ``keys`` give each part's original position."""

    role: str
    parts: list[Any]
    keys: list[Key]
    sources: list[int] = dataclass_field(default_factory=list)
    frozen: bool = False


def _text_of(message: Message) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def _back_part(part: object, orig: object) -> Any:
    """A neutral part as a wire part: the original unless the engine changed its text."""
    if isinstance(part, Mapping) and part.get("type") == "text":
        text = part.get("text")
        if isinstance(orig, Mapping) and _is_text_part(orig):
            return orig if orig.get("text") == text else {**orig, "text": text}
        if not isinstance(orig, Mapping) or _media(orig) is not None:
            return {"text": text}  # the placeholder of a pruned image, or text with no wire part
    return orig if orig is not None else {"text": _text_of({"content": [part]})}


def _back_response(message: Message, orig_part: Mapping[str, Any]) -> Any:
    name = key_of(orig_part, "functionResponse")
    response = orig_part.get(name)
    if not isinstance(response, Mapping):
        return orig_part
    content = message.get("content")
    before, key = response_content(response)
    if content == before:
        return orig_part
    text = content if isinstance(content, str) else _text_of(message)
    new: dict[str, Any] = {**response, "response": {key or "output": text}}
    if isinstance(content, str):
        new.pop("parts", None)  # the whole result was replaced: its media go with it
    return {**orig_part, name: new}


def _segment(message: Message, contents: Sequence[Any], unchanged: bool) -> _Seg | None:
    origin = origin_of(message)
    index = origin[0][0]
    if not 0 <= index < len(contents):
        return None
    orig_parts = _parts(contents[index])
    role = _role(contents[index])
    if len(origin[0]) < 2 or unchanged or is_opaque(message):
        # The whole content, or parts the engine did not change: the original objects.
        ks = [p[1] for p in origin if len(p) > 1] if len(origin[0]) > 1 else list(range(len(orig_parts)))
        return _Seg(
            role, [orig_parts[k] for k in ks], [(index, k, 0) for k in ks], [index], is_opaque(message)
        )
    if message.get("role") == "tool":
        k = origin[0][1]
        return _Seg("user", [_back_response(message, orig_parts[k])], [(index, k, 0)], [index])
    content = message.get("content")
    neutral_list = content if isinstance(content, list) else [{"type": "text", "text": _text_of(message)}]
    parts: list[Any] = []
    keys: list[Key] = []
    j = 0
    for path in origin:
        k = path[1]
        orig = orig_parts[k] if k < len(orig_parts) else None
        if role == "model" and isinstance(orig, Mapping) and field(orig, "functionCall") is not None:
            parts.append(orig)  # calls move with their unit, never edited
        elif j < len(neutral_list):
            parts.append(_back_part(neutral_list[j], orig))
            j += 1
        else:
            continue
        keys.append((index, k, 0))
    return _Seg(role, parts, keys, [index])


def _segments(
    body: Mapping[str, Any], messages: Sequence[Message], source: Sequence[Message] | None
) -> tuple[list[_Seg], Any]:
    contents: list[Any] = body.get("contents") or []
    system_key = key_of(body, "systemInstruction")
    system = body.get(system_key)
    kept = {id(m) for m in source} if source is not None else set()
    out: list[_Seg] = []
    last: Key = (SYSTEM_INDEX - 1, 0, 0)
    for message in messages:
        origin = origin_of(message)
        if not origin:
            out.append(_Seg("user", [{"text": _text_of(message)}], [(last[0], last[1], 1)]))
            continue
        if origin[0][0] == SYSTEM_INDEX:
            if id(message) not in kept and isinstance(system, Mapping):
                system = _back_system(message, system, origin)
            continue
        seg = _segment(message, contents, id(message) in kept)
        if seg is not None:
            out.append(seg)
            if seg.keys:
                last = max(last, max(seg.keys))
    return out, system


def _back_system(message: Message, system: Mapping[str, Any], origin: Sequence[Path]) -> Any:
    orig_parts = _parts(system)
    content = message.get("content")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if is_opaque(message) or not isinstance(content, list):
        return system
    parts = [
        _back_part(p, orig_parts[path[1]] if len(path) > 1 and path[1] < len(orig_parts) else None)
        for p, path in zip(content, origin, strict=False)
    ]
    if len(parts) == len(orig_parts) and all(a is b for a, b in zip(parts, orig_parts, strict=True)):
        return system
    return {**system, "parts": parts}


def _adjacent_in_input(prev: _Seg, seg: _Seg) -> bool:
    """Two whole contents that already stood side by side in the input: kept apart (the input's
    own problem is not ours to fix, and an unchanged body renders as itself)."""
    return bool(prev.sources and seg.sources) and max(prev.sources) + 1 == min(seg.sources)


def _merge(segments: list[_Seg], *, input_opens_with_model: bool) -> list[_Seg]:
    out: list[_Seg] = []
    for seg in segments:
        prev = out[-1] if out else None
        if prev is None or prev.role != seg.role or _adjacent_in_input(prev, seg):
            out.append(seg)
        elif seg.role == "model" and (prev.frozen or seg.frozen):
            out.append(
                _Seg("user", [{"text": SEPARATOR_TEXT}], [(*prev.keys[-1][:2], 1)] if prev.keys else [])
            )
            out.append(seg)
        else:
            pairs = sorted(
                zip(prev.keys + seg.keys, prev.parts + seg.parts, strict=True), key=lambda kp: kp[0]
            )
            out[-1] = _Seg(seg.role, [p for _, p in pairs], [k for k, _ in pairs], prev.sources + seg.sources)
    if out and out[0].role == "model" and not input_opens_with_model:
        out.insert(0, _Seg("user", [{"text": SEPARATOR_TEXT}], [(SYSTEM_INDEX, 0, 1)]))
    return out


def _engine_text_first(seg: _Seg) -> _Seg:
    """``seg`` with the engine's parts (a note, a summary: keys ``(..., 1)``) that would follow a
    function response moved before the first one (Gemini 3 refuses a part after them)."""
    first = next((n for n, p in enumerate(seg.parts) if _responds(p)), None)
    if first is None or not any(key[2] for key in seg.keys[first + 1 :]):
        return seg
    order = list(range(first))
    order += [n for n in range(first, len(seg.parts)) if seg.keys[n][2]]
    order += [n for n in range(first, len(seg.parts)) if not seg.keys[n][2]]
    return _Seg(
        seg.role, [seg.parts[n] for n in order], [seg.keys[n] for n in order], seg.sources, seg.frozen
    )


def _responds(part: object) -> bool:
    return not plain_text(part) and isinstance(part, Mapping) and field(part, "functionResponse") is not None


def _emit(seg: _Seg, contents: Sequence[Any]) -> Any:
    if len(set(seg.sources)) == 1:
        orig = contents[seg.sources[0]]
        parts = _parts(orig)
        if len(parts) == len(seg.parts) and all(a is b for a, b in zip(parts, seg.parts, strict=True)):
            return orig
        return {**orig, "parts": seg.parts}
    return {"role": seg.role, "parts": seg.parts}


def render_contents(
    body: Mapping[str, Any], messages: Sequence[Message], *, source: Sequence[Message] | None = None
) -> dict[str, Any]:
    """``body`` with its conversation replaced by the fitted neutral ``messages``."""
    contents: list[Any] = body.get("contents") or []
    segments, system = _segments(body, messages, source)
    opens = bool(contents) and isinstance(contents[0], Mapping) and _role(contents[0]) == "model"
    merged = [
        _engine_text_first(seg) if seg.role == "user" else seg
        for seg in _merge(segments, input_opens_with_model=opens)
    ]
    out = {**body, "contents": [_emit(seg, contents) for seg in merged]}
    system_key = key_of(body, "systemInstruction")
    if system_key in body:
        out[system_key] = system
    return out


# -- structural rules --------------------------------------------------------------------------


def _turn_start(contents: Sequence[Any]) -> int:
    """Where the current turn starts: the newest user content with text and no function response."""
    for i in range(len(contents) - 1, -1, -1):
        content = contents[i]
        if not isinstance(content, Mapping) or _role(content) != "user":
            continue
        parts = _parts(content)
        texts = any(isinstance(p, Mapping) and isinstance(p.get("text"), str) for p in parts)
        if texts and not _responses_of(parts):
            return i
    return 0


def wire_problems(body: Mapping[str, Any]) -> list[str]:
    """The structural rules ``body`` breaks (see the module docstring), position-free."""
    contents = field(body, "contents") if isinstance(body, Mapping) else None
    if not isinstance(contents, list) or not contents:
        return ["contents is not a non-empty list"]
    if not all(isinstance(c, Mapping) for c in contents):
        return ["a content is not an object"]
    problems: set[str] = set()
    roles = [_role(c) for c in contents]
    if any(c.get("role") not in (None, "", "user", "model") for c in contents):
        problems.add("a content has a role other than user or model")
    if roles[0] != "user":
        problems.add("the first content is not a user content")
    signed = False
    for i, content in enumerate(contents):
        parts = _parts(content)
        signed = signed or any(is_signed(p) for p in parts)
        if not parts:
            problems.add("a content has no parts")
        if i and roles[i - 1] == roles[i]:
            problems.add(f"two adjacent {roles[i]} contents")
        calls = _calls_of(parts) if roles[i] == "model" else []
        if calls and i + 1 < len(contents):
            following = contents[i + 1]
            responses = _responses_of(_parts(following)) if roles[i + 1] == "user" else []
            answered = pair_responses([(n, c) for _, n, c in calls], [(n, r) for _, n, r in responses])
            for n, (_, name, _) in enumerate(calls):
                if n not in answered:
                    problems.add(f"function call {name!r} has no function response in the next content")
        if roles[i] == "user":
            responses = _responses_of(parts)
            if responses and any(not _responds(p) for p in parts[responses[0][0] :]):
                problems.add("a part follows the function responses of a content")
            before = _calls_of(_parts(contents[i - 1])) if i and roles[i - 1] == "model" else []
            matched = pair_responses([(n, c) for _, n, c in before], [(n, r) for _, n, r in responses])
            for (_, name, _), c in zip(responses, matched, strict=True):
                if c is None:
                    problems.add(
                        f"function response {name!r} without its function call in the content before"
                    )
    if signed:
        for i in range(_turn_start(contents), len(contents)):
            calls = _calls_of(_parts(contents[i])) if roles[i] == "model" else []
            if calls and not field(_parts(contents[i])[calls[0][0]], _SIGNATURE):
                problems.add("a function call of the current turn has no thought signature")
    return sorted(problems)


__all__ = [
    "SEPARATOR_TEXT",
    "SYSTEM_INDEX",
    "content_messages",
    "field",
    "is_signed",
    "key_of",
    "neutral_messages",
    "neutral_parts",
    "pair_responses",
    "plain_text",
    "render_contents",
    "response_content",
    "system_message",
    "wire_problems",
]
