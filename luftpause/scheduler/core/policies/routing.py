"""Model routing: a turn may only go to a replica of its own kind that declares its model.

A generative turn (``/v1/chat/completions``) goes only to generative replicas, a single-pass turn
(``/v1/decide``: a classifier or scorer, ``TurnArrived.single_pass``) only to single-pass replicas:
the two never share a slot. A model that no replica of the turn's kind declares is refused with 404
and a message naming the kind, even when a replica of the other kind serves it.

Reads: the turn's model and kind; each replica's ``kind`` and ``models`` (precomputed in
``State.model_replicas`` and ``State.single_pass_model_replicas``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from luftpause.scheduler.core.state import Replica, State

UNKNOWN_MODEL_STATUS = 404


def replicas_for(state: State, model: str, single_pass: bool = False) -> tuple[Replica, ...]:
    """The replicas of the turn's kind declaring ``model``, in configuration order (empty if none)."""
    if single_pass:
        return state.single_pass_model_replicas.get(model, ())
    return state.model_replicas.get(model, ())


def unknown_model_reason(model: str, single_pass: bool = False) -> str:
    """The refusal message for a model no replica of the turn's kind serves (the dataplane's 404 body)."""
    kind = "SinglePass" if single_pass else "Generative"
    return f"no {kind} replica serves model '{model}'"
