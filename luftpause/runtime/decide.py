"""The ``decide`` tool: a quick classification, through the dataplane like every turn.

Two ways (docs/architecture.md "The MCP tools"):

* **without labels**: one single pass on a single-pass replica, ``POST {dataplane}/v1/decide`` with
  vLLM's classification request ``{"model", "input"}``; the answer's first item gives
  ``{"label", "probs", "numClasses"}`` (vLLM ``ClassificationResponse.data[0]``, the classifier's
  own label set, ``probs`` in its label order).
* **with 2-20 labels**: one interactive chat turn on a generative replica with ``max_tokens: 1``,
  ``logprobs: true``, ``top_logprobs: 20``, ``temperature: 0``, scored by the first token's
  log probabilities. The user message lists the labels first, then the input::

      positive | negative | neutral

      Input: <input>

  and a system message asks for exactly one label. Listing the labels first puts them where a
  model's first token is most likely to be one of them, and it is also what the simulated engine
  scores (its first-token alternatives are the first distinct words, three characters or more, of
  the last user message: :mod:`luftpause.testkit.engine.replies`).

  A top-logprob token counts for a label when, lower-cased and stripped of surrounding blanks, it is
  the whole label, or a prefix of exactly one label (a multi-word label is decided by its first
  token, unless another label starts the same way). The probabilities of every token counting for a
  label are summed (``" Yes"`` and ``"yes"`` both count). ``probabilities`` are normalized over the
  labels that were scored; ``unscored`` lists the labels no top token counted for (a label the
  model finds very unlikely, or one past what 20 alternatives hold); ``label`` is the most probable
  scored label, ``null`` when none was scored.

Both return ``model`` and ``mode`` (``"single-pass"`` or ``"labels"``). Errors (the dataplane's
status and message, a reply without what is needed) raise :class:`DecideFailed`.
"""

from __future__ import annotations

import math
import secrets
from typing import Any

from luftpause.runtime.dataplane import DataplaneClient, header_safe
from luftpause.runtime.errors import DataplaneFailed, DecideFailed

MIN_LABELS = 2
MAX_LABELS = 20
TOP_LOGPROBS = 20
"""OpenAI's (and vLLM's default) largest ``top_logprobs``."""

DECIDE_TIMEOUT_SECONDS = 600.0
"""One decision, queue wait at the dataplane included (the turn timeout of docs/architecture.md
"Constants")."""

SYSTEM_PROMPT = (
    "Classify the input. The first line lists the labels. Reply with exactly one of those labels, "
    "written as listed, and nothing else."
)


def label_prompt(input_text: str, labels: list[str]) -> str:
    """The user message of a label decision: the labels first, then the input."""
    return " | ".join(labels) + "\n\nInput: " + input_text


def score_labels(top_logprobs: list[dict[str, Any]], labels: list[str]) -> dict[str, Any]:
    """``{"label", "probabilities", "unscored"}`` from the first token's ``top_logprobs`` (OpenAI
    shape: ``[{"token", "logprob"}]``), by the matching rule of the module docstring."""
    lowered = [label.strip().lower() for label in labels]
    mass: dict[str, float] = {}
    seen_tokens: set[str] = set()
    for item in top_logprobs:
        token, logprob = item.get("token"), item.get("logprob")
        if not isinstance(token, str) or not isinstance(logprob, int | float) or token in seen_tokens:
            continue
        seen_tokens.add(token)
        text = token.strip().lower()
        if not text:
            continue
        exact = [label for label, low in zip(labels, lowered, strict=True) if low == text]
        prefixed = [label for label, low in zip(labels, lowered, strict=True) if low.startswith(text)]
        matched = exact[0] if exact else (prefixed[0] if len(prefixed) == 1 else None)
        if matched is not None:
            mass[matched] = mass.get(matched, 0.0) + math.exp(logprob)
    total = sum(mass.values())
    probabilities = {label: mass[label] / total for label in labels if label in mass} if total > 0 else {}
    best = max(probabilities, key=lambda label: probabilities[label]) if probabilities else None
    return {
        "label": best,
        "probabilities": {label: round(p, 6) for label, p in probabilities.items()},
        "unscored": [label for label in labels if label not in probabilities],
    }


class Decider:
    """Makes decisions through the runtime's :class:`~luftpause.runtime.dataplane.DataplaneClient`."""

    def __init__(self, dataplane: DataplaneClient) -> None:
        self.dataplane = dataplane

    async def _post(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        """POST ``body`` to ``path`` within :data:`DECIDE_TIMEOUT_SECONDS` (a 429 waited out and
        retried); the reply. Raises :class:`DecideFailed`."""
        try:
            return await self.dataplane.post_json(path, body, headers, within=DECIDE_TIMEOUT_SECONDS)
        except DataplaneFailed as exc:
            raise DecideFailed(str(exc)) from None

    async def single_pass(self, input_text: str, model: str, caller: str) -> dict[str, Any]:
        """``decide`` without labels: ``{"mode", "model", "label", "probs", "numClasses"}``."""
        reply = await self._post(
            "/v1/decide",
            {"model": model, "input": input_text},
            {"x-luftpause-class": "interactive", "x-luftpause-caller": header_safe(caller)},
        )
        data = reply.get("data")
        first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else None
        if first is None or not isinstance(first.get("label"), str):
            raise DecideFailed("the single-pass replica's answer has no data[0].label")
        return {
            "mode": "single-pass",
            "model": model,
            "label": first["label"],
            "probs": first.get("probs"),
            "numClasses": first.get("num_classes"),
        }

    async def by_labels(self, input_text: str, labels: list[str], model: str, caller: str) -> dict[str, Any]:
        """``decide`` with labels: ``{"mode", "model", "label", "probabilities", "unscored"}``.
        The turn is its own short run (``decide-<hex>``), ended at the dataplane afterwards."""
        run_id = f"decide-{secrets.token_hex(8)}"
        body = {
            "model": model,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": label_prompt(input_text, labels)},
            ],
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": TOP_LOGPROBS,
        }
        headers = {
            "x-luftpause-run-id": run_id,
            "x-luftpause-class": "interactive",
            "x-luftpause-caller": header_safe(caller),
        }
        try:
            reply = await self._post("/v1/chat/completions", body, headers)
        finally:
            await self.dataplane.end_run(run_id)  # best effort: the scheduler forgets an idle run anyway
        try:
            content = reply["choices"][0]["logprobs"]["content"]
            top = content[0]["top_logprobs"]
        except (KeyError, IndexError, TypeError):
            raise DecideFailed("the reply carries no first-token top_logprobs") from None
        if not isinstance(top, list):
            raise DecideFailed("the reply's top_logprobs is not a list")
        return {"mode": "labels", "model": model, **score_labels(top, labels)}
