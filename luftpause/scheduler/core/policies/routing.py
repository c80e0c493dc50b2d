"""Model routing: a turn may only go to a generative replica that declares its model.

Reads: the turn's model; each replica's ``kind`` and ``models`` (precomputed in
``State.model_replicas``). A model no generative replica declares is refused with 404.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from luftpause.scheduler.core.state import Replica, State

UNKNOWN_MODEL_STATUS = 404


def replicas_for(state: State, model: str) -> tuple[Replica, ...]:
    """The generative replicas declaring ``model``, in configuration order (empty if none)."""
    return state.model_replicas.get(model, ())


def unknown_model_reason(model: str) -> str:
    """The refusal message for a model no generative replica serves (the dataplane's 404 body)."""
    return f"no Generative replica serves model '{model}'"
