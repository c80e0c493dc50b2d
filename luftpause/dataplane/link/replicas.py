"""The replicas as this dataplane knows them: from its configuration at start, then from the
scheduler's replica set (the source of truth: the admin API and SIGHUP change it), which replaces
them whenever the link receives one (:meth:`Replicas.learn`, given to the link when it is built).

What is derived from them is derived here, in one step, so it never drifts apart: the replicas by
name (where turns go), the models ``/v1/models`` lists (in both APIs' shapes), the front doors'
plans (:class:`~luftpause.dataplane.intake.front_doors.FrontDoors`) and each model's output-token
cap.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from pydantic import ValidationError

from luftpause.config import ReplicaConfig
from luftpause.dataplane.apis.models import models_body
from luftpause.dataplane.intake.front_doors import FrontDoors
from luftpause.v1 import scheduler_pb2 as pb

__all__ = ["Replicas"]

log = logging.getLogger("luftpause.dataplane")


class Replicas:
    """``Replicas(replicas, max_tokens)``: the configured ``replicas`` to start with, and
    ``[dataplane] max_tokens`` (model -> the most output tokens a turn may ask for).

    Read (replaced together by :meth:`learn`): ``by_name`` (name -> :class:`ReplicaConfig`),
    ``models`` (in order, each once), ``models_body`` / ``anthropic_models_body`` (``GET
    /v1/models`` in OpenAI's and Anthropic's shape), ``front_doors``."""

    def __init__(
        self, replicas: Sequence[ReplicaConfig], max_tokens: Mapping[str, int] | None = None
    ) -> None:
        self._max_tokens = dict(max_tokens or {})
        self._context_lengths: dict[str, int] = {}
        """Model -> the largest context length (tokens) its replicas' engines report, from the
        scheduler's replica set: a turn's output-token cap where ``max_tokens`` names none."""
        self._set({replica.name: replica for replica in replicas}, {})

    def _set(self, by_name: dict[str, ReplicaConfig], context_lengths: dict[str, int]) -> None:
        self.by_name = by_name
        self._context_lengths = context_lengths
        self.models = list(dict.fromkeys(m for r in by_name.values() for m in r.models))
        self.models_body = models_body(self.models, anthropic=False)
        self.anthropic_models_body = models_body(self.models, anthropic=True)
        self.front_doors = FrontDoors(list(by_name.values()))

    def token_cap(self, model: str) -> int | None:
        """The most output tokens a turn of ``model`` may ask for: ``[dataplane] max_tokens`` for
        it, else the largest context length its replicas report, else ``None`` (no cap)."""
        return self._max_tokens.get(model) or self._context_lengths.get(model)

    def learn(self, replicas: pb.ReplicaSet) -> None:
        """The scheduler's replica set: turns go to these replicas and ``/v1/models`` lists their
        models from now on. A spec this dataplane cannot read is kept as it was, logged."""
        learned: dict[str, ReplicaConfig] = {}
        lengths: dict[str, int] = {}
        for spec in replicas.replicas:
            if spec.max_model_len:
                for model in spec.models:
                    lengths[model] = max(lengths.get(model, 0), spec.max_model_len)
            try:
                learned[spec.name] = ReplicaConfig.model_validate(
                    {
                        "name": spec.name,
                        "url": spec.url,
                        "models": tuple(spec.models),
                        "kind": spec.kind or "generative",
                        "api_key_env": spec.api_key_env or None,
                        "priority": spec.priority or None,
                        "apis": tuple(spec.apis) or ("chat",),
                    }
                )
            except ValidationError as exc:
                log.error("replica %r from the scheduler refused: %s", spec.name, exc)
                if spec.name in self.by_name:
                    learned[spec.name] = self.by_name[spec.name]
        if learned.keys() != self.by_name.keys():
            log.info("replicas from the scheduler: %s", ", ".join(learned) or "none")
        self._set(learned, lengths)
