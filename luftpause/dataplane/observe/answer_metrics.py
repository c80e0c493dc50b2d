"""The dataplane's figures of finished turns: latency and tokens as operators chart them, with the
OpenTelemetry GenAI metric names (semantic conventions v1.41.0, "Metrics for GenAI") in the
Prometheus form of the OpenTelemetry-to-Prometheus mapping (dots to underscores, the unit as a
suffix: ``s`` is ``_seconds``, an annotation unit such as ``{token}`` none):

=========================================================  =========================================
``gen_ai_server_time_to_first_token_seconds``               (``gen_ai.server.time_to_first_token``)
                                                            from the turn's arrival (held time
                                                            included) to its first token, streamed
                                                            turns only
``gen_ai_server_time_per_output_token_seconds``             (``gen_ai.server.time_per_output_token``)
                                                            inter-token latency: from the first
                                                            token to the answer's end over the
                                                            output tokens after the first, streamed
                                                            turns with at least 2 output tokens
``gen_ai_server_request_duration_seconds``                  (``gen_ai.server.request.duration``) the
                                                            turn end to end, arrival to the answer's
                                                            last byte
``gen_ai_client_token_usage{gen_ai_token_type}``            (``gen_ai.client.token.usage``) tokens
                                                            per turn, ``input`` (prompt) and
                                                            ``output`` (completion), as the engine
                                                            reported them
``luftpause_dataplane_tokens_total{type}``                  tokens: ``prompt``, ``completion``,
                                                            ``cached_prompt`` (the prompt tokens the
                                                            engine's prefix cache served:
                                                            ``usage.prompt_tokens_details.
                                                            cached_tokens``)
``luftpause_dataplane_turn_responses_total{code}``          answers to turn routes (``/v1/chat/
                                                            completions``, ``/v1/messages``,
                                                            ``/v1/responses``, ``/v1/decide``) by
                                                            HTTP status; ``499``: the client left
                                                            before an answer began
=========================================================  =========================================

Every family but the last has the labels ``model`` (the turn's), ``replica``, ``service_class``
and ``caller``: the turn caller's root when it is configured (a caller key's caller, a name of
``[scheduler.protection] callers``), ``anonymous``, else ``other`` (:class:`~luftpause.dataplane.
usage.CallerLabels`), so the series are bounded by the configuration. All but the status counter
count finished turns only (a failed turn has ``luftpause_dataplane_turns_total{outcome="failed"}``).
Tokens are what the engine's ``usage`` says, so an inter-token latency needs it in a stream too:
the client asks ``stream_options: {"include_usage": true}`` (luftpause sends the client's request
unchanged), or the engine always sends it.

Cost (docs/architecture.md "Metrics"): per finished turn one dict lookup for its label set and a
few integer additions and bisections on the event loop, folded into families when ``/metrics`` is
scraped; ``bench/test_bench_metrics.py`` measures it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

from luftpause.dataplane.observe.usage import CallerLabels, Totals, Usage
from luftpause.observe.metrics import Histogram
from luftpause.v1 import scheduler_pb2 as pb

__all__ = ["CLIENT_LEFT", "AnswerMetrics"]

CLIENT_LEFT = 499
"""The ``code`` of a turn whose client left before an answer began (nginx's convention)."""

_CLASS_NAMES: dict[int, str] = {
    pb.INTERACTIVE: "interactive",
    pb.BATCH: "batch",
    pb.SERVICE_CLASS_UNSPECIFIED: "interactive",
}

# Seconds and tokens: the conventions' advised bucket boundaries, widened where luftpause differs
# (a held turn waits minutes for its first token; the simulated engines decode in milliseconds).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    30.0, 60.0, 300.0,
)  # fmt: skip
TPOT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
DURATION_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92, 300.0, 600.0,
)  # fmt: skip
TOKEN_BUCKETS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip

LABELS = ["model", "replica", "service_class", "caller"]


class _Figures:
    """One label set's histograms and token counts."""

    __slots__ = ("cached", "completion", "duration", "input", "output", "prompt", "tpot", "ttft")

    def __init__(self) -> None:
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)
        self.duration = Histogram(DURATION_BUCKETS)
        self.input = Histogram(TOKEN_BUCKETS)
        self.output = Histogram(TOKEN_BUCKETS)
        self.prompt = self.completion = self.cached = 0

    def add(self, other: _Figures) -> None:
        for name in ("ttft", "tpot", "duration", "input", "output"):
            getattr(self, name).add(getattr(other, name))
        self.prompt += other.prompt
        self.completion += other.completion
        self.cached += other.cached


class AnswerMetrics:
    """The families of the module docstring, and the :class:`~luftpause.dataplane.observe.usage.Usage`
    folded from them. ``AnswerMetrics(callers, usage_window_s, clock)``: the bounded caller labels,
    the usage's window (seconds) and wall clock (``time.time``)."""

    def __init__(self, callers: CallerLabels, usage_window_s: float, clock: Callable[[], float]) -> None:
        self.callers = callers
        self._by: dict[tuple[str, str, int, str], _Figures] = {}
        self._codes: dict[int, int] = {}
        self.usage = Usage(usage_window_s, clock, self.totals)

    def totals(self) -> Totals:
        """The tokens and turns of finished turns by (caller label, model), summed over replicas
        and classes (:data:`~luftpause.dataplane.observe.usage.Totals`)."""
        folded: dict[tuple[str, str], list[int]] = {}
        for (model, _, _, caller), figures in list(self._by.items()):
            sums = folded.setdefault((caller, model), [0, 0, 0, 0])
            sums[0] += figures.prompt
            sums[1] += figures.completion
            sums[2] += figures.cached
            sums[3] += sum(figures.duration.counts)
        return {key: (a, b, c, d) for key, (a, b, c, d) in folded.items()}

    def finished(
        self,
        model: str,
        replica: str,
        service_class: int,
        caller: str,
        arrived: float,
        first_token_at: float | None,
        now: float,
        prompt: int,
        completion: int,
        cached: int,
    ) -> None:
        """One finished turn: its times (``loop.time()`` seconds: arrival, first token or
        ``None`` for a whole answer, end) and the tokens its engine reported (``-1``: not
        reported, left out)."""
        self.usage.roll()  # before this turn counts: a window that began is taken as it stood
        key = (model, replica, service_class, self.callers(caller))
        figures = self._by.get(key)
        if figures is None:
            figures = self._by[key] = _Figures()
        figures.duration.observe(now - arrived)
        if first_token_at is not None:
            figures.ttft.observe(first_token_at - arrived)
            if completion > 1:
                figures.tpot.observe((now - first_token_at) / (completion - 1))
        if prompt >= 0:
            figures.input.observe(prompt)
            figures.prompt += prompt
        if completion >= 0:
            figures.output.observe(completion)
            figures.completion += completion
        if cached > 0:
            figures.cached += cached

    def responded(self, code: int) -> None:
        """Count one answer to a turn route with HTTP status ``code`` (:data:`CLIENT_LEFT`: none)."""
        codes = self._codes
        codes[code] = codes.get(code, 0) + 1

    def collect(self) -> Iterator[Metric]:
        """The families, for the registry (``prometheus_client``'s collector interface)."""
        merged: dict[tuple[str, str, str, str], _Figures] = {}
        for (model, replica, value, caller), figures in list(self._by.items()):
            labels = (model, replica, _CLASS_NAMES[value], caller)
            if labels not in merged:
                merged[labels] = _Figures()
            merged[labels].add(figures)
        for name, attribute, documentation in (
            (
                "gen_ai_server_time_to_first_token_seconds",
                "ttft",
                "Seconds from a turn's arrival (held time included) to its first token, streamed turns "
                "(OpenTelemetry gen_ai.server.time_to_first_token).",
            ),
            (
                "gen_ai_server_time_per_output_token_seconds",
                "tpot",
                "Inter-token latency: seconds from the first token to the answer's end per output token "
                "after the first (OpenTelemetry gen_ai.server.time_per_output_token).",
            ),
            (
                "gen_ai_server_request_duration_seconds",
                "duration",
                "Seconds from a turn's arrival to the end of its answer, finished turns "
                "(OpenTelemetry gen_ai.server.request.duration).",
            ),
        ):
            family = HistogramMetricFamily(name, documentation, labels=LABELS)
            for labels, figures in merged.items():
                histogram: Histogram = getattr(figures, attribute)
                family.add_metric(list(labels), histogram.buckets(), histogram.total)
            yield family
        usage = HistogramMetricFamily(
            "gen_ai_client_token_usage",
            "Tokens per finished turn as its engine reported them: input (prompt) and output "
            "(completion) (OpenTelemetry gen_ai.client.token.usage).",
            labels=[*LABELS, "gen_ai_token_type"],
        )
        tokens = CounterMetricFamily(
            "luftpause_dataplane_tokens",
            "Tokens of finished turns as their engines reported them: prompt, completion, and "
            "cached_prompt (prompt tokens the engine's prefix cache served).",
            labels=[*LABELS, "type"],
        )
        for labels, figures in merged.items():
            usage.add_metric([*labels, "input"], figures.input.buckets(), figures.input.total)
            usage.add_metric([*labels, "output"], figures.output.buckets(), figures.output.total)
            tokens.add_metric([*labels, "prompt"], figures.prompt)
            tokens.add_metric([*labels, "completion"], figures.completion)
            tokens.add_metric([*labels, "cached_prompt"], figures.cached)
        yield usage
        yield tokens
        codes = CounterMetricFamily(
            "luftpause_dataplane_turn_responses",
            "Answers to turn routes by HTTP status (499: the client left before an answer began).",
            labels=["code"],
        )
        for code, count in sorted(self._codes.items()):
            codes.add_metric([str(code)], count)
        yield codes
