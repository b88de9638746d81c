"""An OpenAI Agents SDK agent that reads files with a function tool: run by
``tests/e2e/test_agents_sdk.py`` with the SDK's own interpreter (``.agents-sdk/``, installed by
``bash .ci/install-agents-sdk``), so the SDK and its dependencies never enter the project's venv.

Usage: ``python agents_sdk_agent.py BASE_URL MODEL WORKDIR PROMPT``. Prints the agent's final output
and exits 0, or prints the error and exits 1. Tracing is off (no network but ``BASE_URL``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI


def main(base_url: str, model: str, workdir: str, prompt: str) -> int:
    set_tracing_disabled(True)
    root = Path(workdir)

    @function_tool
    def read_file(name: str) -> str:
        """Return the whole text of the file ``name`` in the working directory."""
        return (root / name).read_text(encoding="utf-8")

    client = AsyncOpenAI(base_url=base_url, api_key="sk-fake", max_retries=0)
    agent = Agent(
        name="reader",
        instructions="You read the files the user names, one at a time, with read_file.",
        tools=[read_file],
        model=OpenAIResponsesModel(model=model, openai_client=client),
    )
    try:
        result = Runner.run_sync(agent, prompt, max_turns=30)
    except Exception as exc:  # the test reads what failed
        print(f"agent failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(result.final_output)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
