from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ServiceClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SERVICE_CLASS_UNSPECIFIED: _ClassVar[ServiceClass]
    INTERACTIVE: _ClassVar[ServiceClass]
    BATCH: _ClassVar[ServiceClass]

class RunPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_PHASE_UNSPECIFIED: _ClassVar[RunPhase]
    IDLE: _ClassVar[RunPhase]
    GENERATING: _ClassVar[RunPhase]
    TOOL_PAUSED: _ClassVar[RunPhase]
SERVICE_CLASS_UNSPECIFIED: ServiceClass
INTERACTIVE: ServiceClass
BATCH: ServiceClass
RUN_PHASE_UNSPECIFIED: RunPhase
IDLE: RunPhase
GENERATING: RunPhase
TOOL_PAUSED: RunPhase

class DataplaneMessage(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[DataplaneItem]
    def __init__(self, items: _Optional[_Iterable[_Union[DataplaneItem, _Mapping]]] = ...) -> None: ...

class DataplaneItem(_message.Message):
    __slots__ = ("resync", "admit", "cancel", "event", "leased", "ping")
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    ADMIT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    PING_FIELD_NUMBER: _ClassVar[int]
    resync: ResyncRequest
    admit: AdmitRequest
    cancel: CancelAdmit
    event: TurnEvent
    leased: LeasedTurn
    ping: Ping
    def __init__(self, resync: _Optional[_Union[ResyncRequest, _Mapping]] = ..., admit: _Optional[_Union[AdmitRequest, _Mapping]] = ..., cancel: _Optional[_Union[CancelAdmit, _Mapping]] = ..., event: _Optional[_Union[TurnEvent, _Mapping]] = ..., leased: _Optional[_Union[LeasedTurn, _Mapping]] = ..., ping: _Optional[_Union[Ping, _Mapping]] = ...) -> None: ...

class SchedulerMessage(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[SchedulerItem]
    def __init__(self, items: _Optional[_Iterable[_Union[SchedulerItem, _Mapping]]] = ...) -> None: ...

class SchedulerItem(_message.Message):
    __slots__ = ("resynced", "admitted", "lease", "pong", "replicas")
    RESYNCED_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    PONG_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    resynced: ResyncReply
    admitted: AdmitReply
    lease: CapacityLease
    pong: Pong
    replicas: ReplicaSet
    def __init__(self, resynced: _Optional[_Union[ResyncReply, _Mapping]] = ..., admitted: _Optional[_Union[AdmitReply, _Mapping]] = ..., lease: _Optional[_Union[CapacityLease, _Mapping]] = ..., pong: _Optional[_Union[Pong, _Mapping]] = ..., replicas: _Optional[_Union[ReplicaSet, _Mapping]] = ...) -> None: ...

class ReplicaSet(_message.Message):
    __slots__ = ("replicas",)
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaSpec]
    def __init__(self, replicas: _Optional[_Iterable[_Union[ReplicaSpec, _Mapping]]] = ...) -> None: ...

class ReplicaSpec(_message.Message):
    __slots__ = ("name", "url", "models", "kind", "api_key_env", "priority", "apis", "max_model_len")
    NAME_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    API_KEY_ENV_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    APIS_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    name: str
    url: str
    models: _containers.RepeatedScalarFieldContainer[str]
    kind: str
    api_key_env: str
    priority: str
    apis: _containers.RepeatedScalarFieldContainer[str]
    max_model_len: int
    def __init__(self, name: _Optional[str] = ..., url: _Optional[str] = ..., models: _Optional[_Iterable[str]] = ..., kind: _Optional[str] = ..., api_key_env: _Optional[str] = ..., priority: _Optional[str] = ..., apis: _Optional[_Iterable[str]] = ..., max_model_len: _Optional[int] = ...) -> None: ...

class AdmitRequest(_message.Message):
    __slots__ = ("turn_id", "run_id", "model", "service_class", "caller", "dataplane_id", "single_pass", "traceparent", "failover_from", "tool_call_ids")
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SERVICE_CLASS_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    DATAPLANE_ID_FIELD_NUMBER: _ClassVar[int]
    SINGLE_PASS_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    FAILOVER_FROM_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_IDS_FIELD_NUMBER: _ClassVar[int]
    turn_id: str
    run_id: str
    model: str
    service_class: ServiceClass
    caller: str
    dataplane_id: str
    single_pass: bool
    traceparent: str
    failover_from: str
    tool_call_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, turn_id: _Optional[str] = ..., run_id: _Optional[str] = ..., model: _Optional[str] = ..., service_class: _Optional[_Union[ServiceClass, str]] = ..., caller: _Optional[str] = ..., dataplane_id: _Optional[str] = ..., single_pass: _Optional[bool] = ..., traceparent: _Optional[str] = ..., failover_from: _Optional[str] = ..., tool_call_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("replica",)
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    replica: str
    def __init__(self, replica: _Optional[str] = ...) -> None: ...

class Refusal(_message.Message):
    __slots__ = ("reason", "http_status", "retry_after_s")
    REASON_FIELD_NUMBER: _ClassVar[int]
    HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    reason: str
    http_status: int
    retry_after_s: int
    def __init__(self, reason: _Optional[str] = ..., http_status: _Optional[int] = ..., retry_after_s: _Optional[int] = ...) -> None: ...

class AdmitReply(_message.Message):
    __slots__ = ("placed", "refused", "turn_id", "run_id")
    PLACED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    placed: Placement
    refused: Refusal
    turn_id: str
    run_id: str
    def __init__(self, placed: _Optional[_Union[Placement, _Mapping]] = ..., refused: _Optional[_Union[Refusal, _Mapping]] = ..., turn_id: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class CancelAdmit(_message.Message):
    __slots__ = ("turn_id",)
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    turn_id: str
    def __init__(self, turn_id: _Optional[str] = ...) -> None: ...

class TurnEvent(_message.Message):
    __slots__ = ("turn_id", "run_id", "kind", "finish_reason", "tool_calls", "prompt_tokens", "completion_tokens", "error", "first_token_ago_s", "trace_id", "unreachable", "tool_call_ids")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[TurnEvent.Kind]
        STARTED: _ClassVar[TurnEvent.Kind]
        FIRST_TOKEN: _ClassVar[TurnEvent.Kind]
        FINISHED: _ClassVar[TurnEvent.Kind]
        FAILED: _ClassVar[TurnEvent.Kind]
        RUN_ENDED: _ClassVar[TurnEvent.Kind]
        ABANDONED: _ClassVar[TurnEvent.Kind]
    KIND_UNSPECIFIED: TurnEvent.Kind
    STARTED: TurnEvent.Kind
    FIRST_TOKEN: TurnEvent.Kind
    FINISHED: TurnEvent.Kind
    FAILED: TurnEvent.Kind
    RUN_ENDED: TurnEvent.Kind
    ABANDONED: TurnEvent.Kind
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_AGO_S_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_IDS_FIELD_NUMBER: _ClassVar[int]
    turn_id: str
    run_id: str
    kind: TurnEvent.Kind
    finish_reason: str
    tool_calls: bool
    prompt_tokens: int
    completion_tokens: int
    error: str
    first_token_ago_s: float
    trace_id: str
    unreachable: bool
    tool_call_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, turn_id: _Optional[str] = ..., run_id: _Optional[str] = ..., kind: _Optional[_Union[TurnEvent.Kind, str]] = ..., finish_reason: _Optional[str] = ..., tool_calls: _Optional[bool] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., error: _Optional[str] = ..., first_token_ago_s: _Optional[float] = ..., trace_id: _Optional[str] = ..., unreachable: _Optional[bool] = ..., tool_call_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RunRecord(_message.Message):
    __slots__ = ("run_id", "last_replica", "phase", "service_class", "caller", "tool_call_ids")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_REPLICA_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SERVICE_CLASS_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_IDS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    last_replica: str
    phase: RunPhase
    service_class: ServiceClass
    caller: str
    tool_call_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_id: _Optional[str] = ..., last_replica: _Optional[str] = ..., phase: _Optional[_Union[RunPhase, str]] = ..., service_class: _Optional[_Union[ServiceClass, str]] = ..., caller: _Optional[str] = ..., tool_call_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class InFlightTurn(_message.Message):
    __slots__ = ("turn_id", "run_id", "replica", "model", "service_class", "caller")
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SERVICE_CLASS_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    turn_id: str
    run_id: str
    replica: str
    model: str
    service_class: ServiceClass
    caller: str
    def __init__(self, turn_id: _Optional[str] = ..., run_id: _Optional[str] = ..., replica: _Optional[str] = ..., model: _Optional[str] = ..., service_class: _Optional[_Union[ServiceClass, str]] = ..., caller: _Optional[str] = ...) -> None: ...

class ResyncRequest(_message.Message):
    __slots__ = ("dataplane_id", "runs", "turns", "pending_turn_ids", "takes_leases", "more_follows")
    DATAPLANE_ID_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    PENDING_TURN_IDS_FIELD_NUMBER: _ClassVar[int]
    TAKES_LEASES_FIELD_NUMBER: _ClassVar[int]
    MORE_FOLLOWS_FIELD_NUMBER: _ClassVar[int]
    dataplane_id: str
    runs: _containers.RepeatedCompositeFieldContainer[RunRecord]
    turns: _containers.RepeatedCompositeFieldContainer[InFlightTurn]
    pending_turn_ids: _containers.RepeatedScalarFieldContainer[str]
    takes_leases: bool
    more_follows: bool
    def __init__(self, dataplane_id: _Optional[str] = ..., runs: _Optional[_Iterable[_Union[RunRecord, _Mapping]]] = ..., turns: _Optional[_Iterable[_Union[InFlightTurn, _Mapping]]] = ..., pending_turn_ids: _Optional[_Iterable[str]] = ..., takes_leases: _Optional[bool] = ..., more_follows: _Optional[bool] = ...) -> None: ...

class CapacityLease(_message.Message):
    __slots__ = ("replica", "epoch", "grant", "revoke", "models")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    GRANT_FIELD_NUMBER: _ClassVar[int]
    REVOKE_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    replica: str
    epoch: int
    grant: int
    revoke: bool
    models: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, replica: _Optional[str] = ..., epoch: _Optional[int] = ..., grant: _Optional[int] = ..., revoke: _Optional[bool] = ..., models: _Optional[_Iterable[str]] = ...) -> None: ...

class LeasedTurn(_message.Message):
    __slots__ = ("turn_id", "run_id", "model", "service_class", "caller", "replica", "epoch", "traceparent")
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SERVICE_CLASS_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    turn_id: str
    run_id: str
    model: str
    service_class: ServiceClass
    caller: str
    replica: str
    epoch: int
    traceparent: str
    def __init__(self, turn_id: _Optional[str] = ..., run_id: _Optional[str] = ..., model: _Optional[str] = ..., service_class: _Optional[_Union[ServiceClass, str]] = ..., caller: _Optional[str] = ..., replica: _Optional[str] = ..., epoch: _Optional[int] = ..., traceparent: _Optional[str] = ...) -> None: ...

class ResyncReply(_message.Message):
    __slots__ = ("runs", "turns", "pongs", "healthy_replicas")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    PONGS_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    runs: int
    turns: int
    pongs: bool
    healthy_replicas: int
    def __init__(self, runs: _Optional[int] = ..., turns: _Optional[int] = ..., pongs: _Optional[bool] = ..., healthy_replicas: _Optional[int] = ...) -> None: ...

class Ping(_message.Message):
    __slots__ = ("seq",)
    SEQ_FIELD_NUMBER: _ClassVar[int]
    seq: int
    def __init__(self, seq: _Optional[int] = ...) -> None: ...

class Pong(_message.Message):
    __slots__ = ("seq", "healthy_replicas")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    healthy_replicas: int
    def __init__(self, seq: _Optional[int] = ..., healthy_replicas: _Optional[int] = ...) -> None: ...
