"""The example app of docker-compose.yml: an OpenAI client that talks to ctxproxy.

It waits until ctxproxy's ``GET /readyz`` answers 200 (vocabularies loaded, upstream reachable),
then sends one chat completion whose conversation is longer than the model's window, and prints
what the proxy did (its ``X-Context-*`` headers) and the model's answer. A call that fails (no
connection, a 5xx, a 429) is retried with a growing pause; if the proxy never gets ready or the
calls keep failing, it exits 1 and the compose restart policy (``on-failure``) starts it again.

Standard library only, so it runs on the bare ``python`` image; an app using an OpenAI SDK needs
only ``OPENAI_BASE_URL`` pointed at ctxproxy. Environment: ``OPENAI_BASE_URL`` (required),
``OPENAI_API_KEY``, ``EXAMPLE_MODEL``, ``EXAMPLE_READY_TIMEOUT_S`` (default 300),
``EXAMPLE_ATTEMPTS`` (default 5), ``EXAMPLE_PAUSE_S`` (first pause between tries, default 2).
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})


def long_conversation(*, turns: int = 28) -> list[dict[str, str]]:
    """A conversation of about 12,000 tokens: more than the demo model's 8,192-token window."""
    filler = " ".join(f"note{n} about the deployment checklist item {n % 17}" for n in range(45))
    messages = [{"role": "system", "content": "You are a concise assistant."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Turn {turn}: please keep this in mind. {filler}"})
        messages.append({"role": "assistant", "content": f"Noted turn {turn}."})
    messages.append({"role": "user", "content": "In one sentence: what is this conversation about?"})
    return messages


def proxy_root(base_url: str) -> str:
    """ctxproxy's root (where /readyz is) from an OpenAI base URL such as http://ctxproxy:8080/v1."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def wait_ready(root: str, *, timeout_s: float, pause_s: float) -> bool:
    """Poll ``{root}/readyz`` until it answers 200; False when ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{root}/readyz", timeout=5) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError) as exc:
            print(f"example app: ctxproxy not ready yet ({exc})", flush=True)
        if time.monotonic() + pause_s > deadline:
            return False
        time.sleep(pause_s)


def chat(base_url: str, *, api_key: str, model: str) -> tuple[dict[str, str], dict[str, Any]]:
    """One chat completion: the ``X-Context-*`` headers of the answer and its JSON body."""
    body = json.dumps({"model": model, "messages": long_conversation(), "max_tokens": 64}).encode()
    request = urllib.request.Request(
        f"{base_url.rstrip('/')}/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        headers = {k: v for k, v in response.headers.items() if k.lower().startswith("x-context-")}
        return headers, json.load(response)


def main() -> int:
    base_url = os.environ["OPENAI_BASE_URL"]
    api_key = os.environ.get("OPENAI_API_KEY", "not-needed")
    model = os.environ.get("EXAMPLE_MODEL", "qwen2.5-0.5b-instruct")
    attempts = int(os.environ.get("EXAMPLE_ATTEMPTS", "5"))
    pause_s = float(os.environ.get("EXAMPLE_PAUSE_S", "2"))
    ready_timeout_s = float(os.environ.get("EXAMPLE_READY_TIMEOUT_S", "300"))

    if not wait_ready(proxy_root(base_url), timeout_s=ready_timeout_s, pause_s=pause_s):
        print(f"example app: ctxproxy not ready after {ready_timeout_s:g} s", file=sys.stderr, flush=True)
        return 1
    for attempt in range(1, attempts + 1):
        try:
            headers, answer = chat(base_url, api_key=api_key, model=model)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            if exc.code not in RETRYABLE_STATUSES:
                print(f"example app: HTTP {exc.code}: {detail}", file=sys.stderr, flush=True)
                return 1
            print(f"example app: attempt {attempt}: HTTP {exc.code}: {detail}", flush=True)
        except (urllib.error.URLError, OSError) as exc:
            print(f"example app: attempt {attempt}: {exc}", flush=True)
        else:
            for name, value in sorted(headers.items()):
                print(f"example app: {name}: {value}", flush=True)
            print(f"example app: answer: {answer['choices'][0]['message']['content']}", flush=True)
            return 0
        if attempt < attempts:
            time.sleep(pause_s * attempt)
    print(f"example app: gave up after {attempts} attempts", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
