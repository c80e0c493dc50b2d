"""What the three example agents share: their command line and the luftpause headers.

Each example is an agent that keeps its own loop and reaches luftpause as an OpenAI-compatible
endpoint (the dataplane), sending the three headers that make its turns one *run* of a *service
class* for a *caller* (docs/architecture.md "The proxy"):

* ``x-luftpause-run-id``: every turn of this agent's task is one run (affinity, tool pauses);
* ``x-luftpause-class``: ``interactive`` (a person waits) or ``batch``;
* ``x-luftpause-caller``: who is asking, for fairness between callers (up to 128 bytes).

When it ends, each example prints one JSON line: ``{"run_id", "class", "caller", "turns",
"run_ids_returned", "answer"}``, where ``run_ids_returned`` is the ``x-luftpause-run-id`` header of
each turn's response (the run the dataplane put the turn in).
"""

from __future__ import annotations

import argparse
import json
import os
import uuid

import httpx

DEFAULT_BASE_URL = "http://127.0.0.1:8080/v1"
DEFAULT_MODEL = "llama-3.2-1b"


def parse_args(description: str) -> argparse.Namespace:
    """``--base-url`` (default ``$LUFTPAUSE_BASE_URL``, else :data:`DEFAULT_BASE_URL`), ``--model``
    (default ``$LUFTPAUSE_MODEL``, else :data:`DEFAULT_MODEL`), ``--run-id`` (default
    ``example-<uuid4>``), ``--service-class``, ``--caller``, ``--task``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--base-url",
        default=os.environ.get("LUFTPAUSE_BASE_URL", DEFAULT_BASE_URL),
        help="the dataplane's OpenAI base URL, with /v1 (default: $LUFTPAUSE_BASE_URL or %(default)s)",
    )
    parser.add_argument(
        "--model",
        default=os.environ.get("LUFTPAUSE_MODEL", DEFAULT_MODEL),
        help=f"the model every turn asks for (default: $LUFTPAUSE_MODEL or {DEFAULT_MODEL})",
    )
    parser.add_argument(
        "--run-id",
        default=None,
        help="x-luftpause-run-id of every turn (default: example-<a new UUID>)",
    )
    parser.add_argument(
        "--service-class",
        choices=("interactive", "batch"),
        default="interactive",
        help="x-luftpause-class of every turn (default: %(default)s)",
    )
    parser.add_argument(
        "--caller", default="examples", help="x-luftpause-caller of every turn (default: %(default)s)"
    )
    parser.add_argument(
        "--task",
        default="Find out what luftpause does and answer in one sentence.",
        help="the agent's task (default: %(default)r)",
    )
    args = parser.parse_args()
    args.run_id = args.run_id or f"example-{uuid.uuid4()}"
    return args


def api_key() -> str:
    """``LUFTPAUSE_TOKEN`` when the stack requires one; the OpenAI clients insist on some key."""
    return os.environ.get("LUFTPAUSE_TOKEN") or "unused"


def luftpause_headers(args: argparse.Namespace) -> dict[str, str]:
    """The three headers, sent with every turn."""
    return {
        "x-luftpause-run-id": args.run_id,
        "x-luftpause-class": args.service_class,
        "x-luftpause-caller": args.caller,
    }


class RunIdRecorder:
    """An httpx response hook keeping each chat completion's ``x-luftpause-run-id`` header."""

    def __init__(self) -> None:
        self.run_ids: list[str | None] = []

    def __call__(self, response: httpx.Response) -> None:
        if response.request.url.path.endswith("/chat/completions"):
            self.run_ids.append(response.headers.get("x-luftpause-run-id"))

    async def async_hook(self, response: httpx.Response) -> None:
        self(response)


def lookup(query: str) -> str:
    """The examples' one tool: a stand-in for a search that a real agent would call."""
    return f"luftpause notes on {query!r}: it schedules the turns of agent runs on shared engines."


def report(args: argparse.Namespace, run_ids: list[str | None], answer: str) -> None:
    print(
        json.dumps(
            {
                "run_id": args.run_id,
                "class": args.service_class,
                "caller": args.caller,
                "turns": len(run_ids),
                "run_ids_returned": run_ids,
                "answer": answer,
            }
        ),
        flush=True,
    )
