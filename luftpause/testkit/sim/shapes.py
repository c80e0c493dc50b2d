"""Load shapes as data: a TOML file that says everything a flood in virtual time needs.

    shape = load_shape_file(Path("bench/shapes/published.toml"))
    report = simulate(shape.spec(seed=shape.seeds[0]), "luftpause")

The keys (and only these; any other is refused, named)::

    duration_s = 180                   # the window, seconds
    seeds = [0, 1, 2]
    replicas = 2
    slots = 8                          # running requests per engine, or "none" (the profile's bound)
    profile = "sglang-llama-3.2-1b-fp8-8gb"
    via = "own_loop"                   # or "mcp"
    context_tokens = 2650              # the system prompt before a run's first turn
    reply_tokens = 256
    tool_call_tokens = 22              # optional: a reply that calls the tool (default 22)
    tool_result_tokens = 18            # optional: a tool's result in the next prompt (default 18)

    [engine]                           # every arrangement's engines alike
    queue = "lpm"                      # "fcfs" | "lpm" | "priority"
    pool_scale = 1.5                   # multiplies the profile's KV pool

    [[groups]]
    agents = 48
    class = "batch"                    # or "interactive"
    caller = "bulk"
    tool_rounds = 3
    tool_seconds = { dist = "lognormal", median = 2.0, p99 = 60.0 }
    # or { dist = "constant", seconds = 0.5 }, { dist = "choice", values = [0.1, 30.0], weights = [0.9, 0.1] }

``[engine]`` and its keys may be left out (``fcfs``, 1.0). The rest of a prompt is counted as
:func:`~.workload.published_shape` counts the HTTP agents' (Llama 3's tokens for the task with
the tool preamble, a tool call and a tool result), unless ``tool_call_tokens`` (what a reply that
calls the tool decodes, reasoning included) and ``tool_result_tokens`` (what each tool round adds
to the next prompt) say otherwise, as for agents whose steps think at length or read documents.
A file is parsed with :mod:`tomllib` and
checked by a pydantic model; :func:`load_shape_file` raises :class:`ShapeError` naming the key
at fault.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from luftpause.testkit.engine.model import PROFILES
from luftpause.testkit.sim.flood import FloodSpec
from luftpause.testkit.sim.workload import (
    LLAMA3_TASK_TOKENS,
    LLAMA3_TOOL_CALL_TOKENS,
    LLAMA3_TOOL_RESULT_TOKENS,
    AgentGroup,
    LoadShape,
    ToolTime,
)

__all__ = ["ShapeError", "ShapeFile", "load_shape_file", "parse_shape"]


class ShapeError(ValueError):
    """A shape file that cannot be read or says something invalid; the message names the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Constant(_Strict):
    dist: Literal["constant"]
    seconds: float = Field(ge=0)


class _Lognormal(_Strict):
    dist: Literal["lognormal"]
    median: float = Field(gt=0)
    p99: float = Field(gt=0)


class _Choice(_Strict):
    dist: Literal["choice"]
    values: list[Annotated[float, Field(ge=0)]] = Field(min_length=1)
    weights: list[Annotated[float, Field(ge=0)]] = Field(min_length=1)


_ToolSeconds = Annotated[_Constant | _Lognormal | _Choice, Field(discriminator="dist")]


class _Group(_Strict):
    agents: int = Field(ge=1)
    service_class: Literal["interactive", "batch"] = Field(alias="class")
    caller: str = Field(min_length=1)
    tool_rounds: int = Field(ge=0)
    tool_seconds: _ToolSeconds


class _Engine(_Strict):
    queue: Literal["fcfs", "lpm", "priority"] = "fcfs"
    pool_scale: float = Field(default=1.0, gt=0)


class _Shape(_Strict):
    duration_s: float = Field(gt=0)
    seeds: list[int] = Field(min_length=1)
    replicas: int = Field(ge=1)
    slots: int | Literal["none"]
    profile: str = Field(min_length=1)
    via: Literal["own_loop", "mcp"]
    context_tokens: int = Field(ge=1)
    reply_tokens: int = Field(ge=1)
    tool_call_tokens: int = Field(default=LLAMA3_TOOL_CALL_TOKENS, ge=1)
    tool_result_tokens: int = Field(default=LLAMA3_TOOL_RESULT_TOKENS, ge=1)
    engine: _Engine = _Engine()
    groups: list[_Group] = Field(min_length=1)


@dataclass(frozen=True, slots=True)
class ShapeFile:
    """A parsed shape: the agents' load, the engines and the seeds to run it with."""

    name: str
    load: LoadShape
    seeds: tuple[int, ...]
    replicas: int
    slots: int | None
    profile: str
    queue: str
    pool_scale: float

    def spec(self, seed: int, **changes: Any) -> FloodSpec:
        """The :class:`FloodSpec` of one seed; ``changes``: any other :class:`FloodSpec` field."""
        return FloodSpec(
            self.load,
            self.profile,
            slots=self.slots,
            replicas=self.replicas,
            seed=seed,
            queue=self.queue,
            pool_scale=self.pool_scale,
            **changes,
        )


def _tool_time(model: _Constant | _Lognormal | _Choice) -> ToolTime:
    if isinstance(model, _Constant):
        return ToolTime("constant", seconds=model.seconds)
    if isinstance(model, _Lognormal):
        return ToolTime("lognormal", median=model.median, p99=model.p99)
    return ToolTime("choice", values=tuple(model.values), weights=tuple(model.weights))


def _where(location: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in location:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in ("constant", "lognormal", "choice") and parts and parts[-1].endswith("tool_seconds"):
            continue  # the union's branch, not a key of the file
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts) or "(the file)"


def parse_shape(data: dict[str, Any], name: str = "shape", source: str | None = None) -> ShapeFile:
    """A shape from TOML's parsed ``data``; ``name`` for reports, ``source`` (default ``name``) to
    open each message. Raises :class:`ShapeError` naming each key at fault (an unknown key, a
    missing one, a bad value): ``"<source>: groups[0].tool_seconds: Field required"``."""
    where = name if source is None else source
    try:
        model = _Shape.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(f"{_where(e['loc'])}: {e['msg']}" for e in error.errors())
        raise ShapeError(f"{where}: {problems}") from None
    if model.profile not in PROFILES:
        raise ShapeError(
            f"{where}: profile: unknown engine profile {model.profile!r}; known: {', '.join(PROFILES)}"
        )
    groups = []
    for index, group in enumerate(model.groups):
        try:
            tool = _tool_time(group.tool_seconds)
        except ValueError as error:
            raise ShapeError(f"{where}: groups[{index}].tool_seconds: {error}") from None
        groups.append(
            AgentGroup(
                group.agents,
                group.service_class,
                group.caller,
                model.via,
                tool_rounds=group.tool_rounds,
                tool_seconds=tool,
            )
        )
    load = LoadShape(
        tuple(groups),
        duration_s=model.duration_s,
        context_tokens=model.context_tokens,
        task_tokens=LLAMA3_TASK_TOKENS,
        reply_tokens=model.reply_tokens,
        tool_call_tokens=model.tool_call_tokens,
        tool_result_tokens=model.tool_result_tokens,
        tool_rounds=max(group.tool_rounds for group in model.groups),
    )
    return ShapeFile(
        name,
        load,
        tuple(model.seeds),
        model.replicas,
        None if model.slots == "none" else model.slots,
        model.profile,
        model.engine.queue,
        model.engine.pool_scale,
    )


def load_shape_file(path: Path) -> ShapeFile:
    """The shape in the TOML file at ``path`` (named after the file's stem). Raises
    :class:`ShapeError`, its message opened by ``path``, for a file that cannot be read, is not
    TOML, or breaks a rule above."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as error:
        raise ShapeError(f"{path}: cannot read: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise ShapeError(f"{path}: not TOML: {error}") from None
    return parse_shape(data, path.stem, source=str(path))
