"""Engine profiles: how big the KV pool is, how a step is scheduled and how long it takes.

A profile is derived, never fitted: from a model's shape (layers, KV heads, head dim, dtypes;
the model's published ``config.json``), the hardware's published figures (memory, bandwidth,
tensor throughput) or a measurement on this machine (REFERENCES.md), and the engine's own
defaults (cited by file and revision). :data:`PROFILES` holds the named ones; each derivation is
a function whose docstring gives every figure's source, and :attr:`EngineProfile.sources`
repeats them for ``/server_info``.

The step time model (:class:`StepCosts`) is a roofline in three terms, as an engine step reads
the weights once, computes every token it schedules, and reads the KV of every request in it:

    step_s = fixed_s + compute_s_per_token * computed_tokens + context_s_per_token * context_tokens

``computed_tokens`` are prefill and decode tokens alike (the same matmuls per token);
``context_tokens`` the KV each scheduled request attends over (its context before the step).
Not modelled: the quadratic part of prefill attention, CUDA-graph batch padding, the CPU time
of the scheduler beyond a constant.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = [
    "LLAMA_3_2_1B",
    "PROFILES",
    "QWEN3_8B",
    "SMOLLM2_135M",
    "STYLES",
    "EngineProfile",
    "ModelShape",
    "StepCosts",
    "llamacpp_smollm2_135m_cpu",
    "profile",
    "sglang_llama_3_2_1b_fp8_8gb",
    "vllm_llama_3_2_1b_fp8_8gb",
    "vllm_qwen3_8b_bf16_rtx5090",
]

# Scheduler styles: admission, what happens when KV runs out, and what shares a step.
STYLES = ("sglang", "vllm", "llamacpp")

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A decoder-only transformer's shape (its ``config.json``) and the dtypes it is served in.

    ``weight_bytes`` is bytes per parameter of the linear layers; ``embedding_bytes`` of the
    embedding (tied to the LM head when ``tied``) and norms, which FP8 checkpoints keep in
    BF16; ``kv_bytes`` per KV element (SGLang's and vLLM's ``--kv-cache-dtype auto`` keeps the
    activations' dtype, BF16, for an FP8-weight checkpoint).
    """

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    weight_bytes: float
    embedding_bytes: float
    kv_bytes: float

    @property
    def linear_params(self) -> int:
        """Parameters of the attention and MLP projections (q, k, v, o, gate, up, down)."""
        attention = (
            self.hidden * self.heads * self.head_dim * 2 + self.hidden * self.kv_heads * self.head_dim * 2
        )
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attention + mlp)

    @property
    def other_params(self) -> int:
        """Embedding (and LM head unless tied) and RMS norms."""
        embedding = self.vocab * self.hidden * (1 if self.tied else 2)
        return embedding + (2 * self.layers + 1) * self.hidden

    @property
    def params(self) -> int:
        return self.linear_params + self.other_params

    @property
    def weights_bytes(self) -> float:
        return self.linear_params * self.weight_bytes + self.other_params * self.embedding_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of every layer for one token: ``2 * layers * kv_heads * head_dim * kv_bytes``."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes

    @property
    def flops_per_token(self) -> float:
        """Matmul FLOPs of one token through the projections (2 per multiply-add)."""
        return 2.0 * self.linear_params


# meta-llama/Llama-3.2-1B config.json: hidden_size 2048, intermediate_size 8192, 16 layers, 32
# attention heads, 8 KV heads, head_dim 64, vocab 128256, tie_word_embeddings true (1.24 B
# parameters). Served in FP8 (e.g. an FP8-dynamic checkpoint: linear layers FP8, embedding and
# norms BF16), KV in BF16.
LLAMA_3_2_1B = ModelShape(
    name="Llama-3.2-1B (FP8 weights, BF16 KV)",
    hidden=2048,
    intermediate=8192,
    layers=16,
    heads=32,
    kv_heads=8,
    head_dim=64,
    vocab=128256,
    tied=True,
    weight_bytes=1.0,
    embedding_bytes=2.0,
    kv_bytes=2.0,
)

# HuggingFaceTB/SmolLM2-135M-Instruct config.json: hidden_size 576, intermediate_size 1536, 30
# layers, 9 heads, 3 KV heads (head_dim 64), vocab 49152, tied (135 M parameters). llama.cpp's
# KV cache is F16 by default (--cache-type-k/-v f16); the weights' bytes are not used below.
SMOLLM2_135M = ModelShape(
    name="SmolLM2-135M-Instruct (GGUF, F16 KV)",
    hidden=576,
    intermediate=1536,
    layers=30,
    heads=9,
    kv_heads=3,
    head_dim=64,
    vocab=49152,
    tied=True,
    weight_bytes=1.0,
    embedding_bytes=1.0,
    kv_bytes=2.0,
)


# Qwen/Qwen3-8B config.json (NVIDIA's Orchestrator-8B, which ThunderAgent's ToolOrchestra runs
# serve, is a Qwen3-8B fine-tune of the same shape): hidden_size 4096, intermediate_size 12288,
# 36 layers, 32 attention heads, 8 KV heads, head_dim 128, vocab 151936, tie_word_embeddings
# false (8.19 B parameters). Served in BF16 ("FP16 precision" in the paper), KV in BF16.
QWEN3_8B = ModelShape(
    name="Qwen3-8B (BF16 weights, BF16 KV)",
    hidden=4096,
    intermediate=12288,
    layers=36,
    heads=32,
    kv_heads=8,
    head_dim=128,
    vocab=151936,
    tied=False,
    weight_bytes=2.0,
    embedding_bytes=2.0,
    kv_bytes=2.0,
)


@dataclass(frozen=True, slots=True)
class StepCosts:
    """Seconds of one engine step (see the module docstring); each term at least 0."""

    fixed_s: float
    compute_s_per_token: float
    context_s_per_token: float

    def __post_init__(self) -> None:
        for name in ("fixed_s", "compute_s_per_token", "context_s_per_token"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number, not negative; got {value}")

    def step_seconds(self, computed_tokens: int, context_tokens: int) -> float:
        """Seconds of a step computing ``computed_tokens`` over ``context_tokens`` of KV."""
        return (
            self.fixed_s
            + self.compute_s_per_token * computed_tokens
            + self.context_s_per_token * context_tokens
        )


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """One engine on one machine: its scheduler style, KV pool, step budget and step costs.

    * ``style``: one of :data:`STYLES`. ``"sglang"``: admission reserves ``max_tokens`` scaled
      by the new-token ratio, decode out of room retracts; ``"vllm"``: KV allocated as requests
      decode, out of room preempts the newest running request; ``"llamacpp"``: ``max_running``
      slots, each with its own context of ``pool_tokens / max_running`` tokens and a prompt
      cache of the last request it served (no sharing, no retraction).
    * ``pool_tokens``: KV pool size in tokens; ``max_running``: requests running at once at
      most (SGLang ``max_running_requests``, vLLM ``max_num_seqs``, llama.cpp ``--parallel``).
    * ``step_tokens``: tokens one step may compute: SGLang's ``chunked_prefill_size`` (prefill
      only; decode steps are separate unless ``mixed``), vLLM's ``max_num_batched_tokens``
      (decode tokens included), llama.cpp's ``--batch-size``.
    * ``mixed``: decode tokens of running requests share a step with prefill chunks (vLLM,
      llama.cpp, SGLang ``--enable-mixed-chunk``); without, a step is either a prefill or a
      decode, prefill first (SGLang's default).
    * SGLang's new-token ratio: starts at ``init_new_token_ratio``, falls by ``(init - init *
      min_new_token_ratio_factor) / new_token_ratio_decay_steps`` per decode step, is reset to
      the start when the engine is idle and raised by each retraction; ``retract_decode_steps``
      and ``clip_max_new_tokens`` as SGLang's.
    * ``slot_prompt_similarity``: llama.cpp's ``--slot-prompt-similarity``: a waiting request
      takes the idle slot whose cached prompt shares the largest fraction of its prompt, if above
      this, else the least recently used idle slot; ``ram_cache_tokens``: tokens its prompt cache
      in host memory (``--cache-ram``) holds, 0 for none (see :mod:`.llamacpp_style`).
    * ``sources``: where each figure comes from, by parameter name.
    """

    name: str
    style: str
    pool_tokens: int
    max_running: int
    step_tokens: int
    mixed: bool
    costs: StepCosts
    init_new_token_ratio: float = 0.7
    min_new_token_ratio_factor: float = 0.14
    new_token_ratio_decay_steps: int = 600
    retract_decode_steps: int = 20
    clip_max_new_tokens: int = 4096
    slot_prompt_similarity: float = 0.1
    ram_cache_tokens: int = 0
    sources: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ValueError(f"style must be one of {STYLES}, got {self.style!r}")
        for name in ("pool_tokens", "max_running", "step_tokens", "new_token_ratio_decay_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.style == "llamacpp" and self.pool_tokens < self.max_running:
            raise ValueError("a llama.cpp profile needs at least 1 context token per slot")
        if not 0 < self.init_new_token_ratio <= 1 or not 0 <= self.min_new_token_ratio_factor <= 1:
            raise ValueError("the new-token ratio and its floor factor must be fractions")

    @property
    def min_new_token_ratio(self) -> float:
        return self.init_new_token_ratio * self.min_new_token_ratio_factor

    @property
    def new_token_ratio_decay(self) -> float:
        return (self.init_new_token_ratio - self.min_new_token_ratio) / self.new_token_ratio_decay_steps

    @property
    def slot_tokens(self) -> int:
        """Context tokens per slot of a llama.cpp profile (``pool_tokens // max_running``)."""
        return self.pool_tokens // self.max_running

    def with_changes(self, **changes: object) -> EngineProfile:
        """This profile with fields replaced (e.g. ``pool_tokens`` for a test)."""
        from dataclasses import replace

        return replace(self, **changes)  # type: ignore[arg-type]


def sglang_llama_3_2_1b_fp8_8gb() -> EngineProfile:
    """Llama-3.2-1B in FP8 under SGLang, one of two replicas on one 8 GB laptop GPU.

    * GPU: an RTX 4060 Laptop GPU, the common 8 GB laptop part: 8 GiB GDDR6 on a 128-bit bus at
      16 Gbps = 256 GB/s (NVIDIA's specifications); 24 SMs of Ada tensor cores at up to
      2.37 GHz: 24 x 1024 FP8 FLOP/clock/SM with FP32 accumulation (GeForce rate) ~ 58 TFLOPS.
    * Achieved fractions: 80 % of peak bandwidth for streaming reads (what GDDR6 cards reach in
      copy benchmarks), 50 % of peak FLOPS for prefill GEMMs of a model this small.
    * Pool: ``(8 GiB x mem_fraction_static - weights) / KV bytes per token``, where
      ``mem_fraction_static`` is 0.4, the value compose.testbed.yaml gives each of its two SGLang
      replicas on one GPU (SGLang's ``profile_max_num_token``: the pool is what the static
      fraction leaves after the weights). Weights: 973 M FP8 linear parameters + 263 M BF16
      embedding parameters = 1.50 GB; KV: 2 x 16 layers x 8 heads x 64 x 2 bytes = 32 KiB/token.
    * ``chunked_prefill_size`` 2048 and CUDA graphs up to batch 8: SGLang's defaults for GPUs
      under 20 GiB (``server_args.py``, ``_handle_gpu_memory_settings``);
      ``max_running_requests``: SGLang derives at least 2048 from the pool
      (``model_runner.py``), i.e. no bound for this load.
    * Step: fixed = weights read once (1.50 GB at 205 GB/s = 7.3 ms) + 1 ms of scheduler and
      launch overhead; compute = 1.95 GFLOP per token at 29 TFLOPS = 67 us; context = 32 KiB
      per token at 205 GB/s = 0.16 us per token of KV read.
    * New-token ratio 0.7, floor factor 0.14, decay over 600 steps, ``retract_decode_steps``
      20, ``CLIP_MAX_NEW_TOKENS`` 4096: SGLang's ``global_config`` /
      ``schedule_policy.py`` (00550cd11b35def9d584bf761a1e32729c20a21d).
    """
    shape = LLAMA_3_2_1B
    bandwidth = 256e9 * 0.8
    flops = 24 * 1024 * 2.37e9 * 0.5
    pool = int((8 * GIB * 0.4 - shape.weights_bytes) // shape.kv_bytes_per_token)
    costs = StepCosts(
        fixed_s=shape.weights_bytes / bandwidth + 0.001,
        compute_s_per_token=shape.flops_per_token / flops,
        context_s_per_token=shape.kv_bytes_per_token / bandwidth,
    )
    return EngineProfile(
        name="sglang-llama-3.2-1b-fp8-8gb",
        style="sglang",
        pool_tokens=pool,
        max_running=2048,
        step_tokens=2048,
        mixed=False,
        costs=costs,
        sources=MappingProxyType(
            {
                "pool_tokens": "(8 GiB x mem_fraction_static 0.4 (compose.testbed.yaml) - 1.50 GB "
                "weights) / 32 KiB per token (Llama-3.2-1B config.json, BF16 KV)",
                "max_running": "SGLang model_runner: max(pool / context_len * 512, 2048)",
                "step_tokens": "SGLang server_args: chunked_prefill_size 2048 below 20 GiB",
                "mixed": "SGLang default: enable_mixed_chunk false",
                "fixed_s": "1.50 GB weights at 80 % of 256 GB/s (RTX 4060 Laptop) + 1 ms overhead",
                "compute_s_per_token": "1.95 GFLOP/token at 50 % of 58 TFLOPS FP8 (24 Ada SMs)",
                "context_s_per_token": "32 KiB KV per token at 80 % of 256 GB/s",
                "new_token_ratio": "SGLang global_config: 0.7, x0.14, 600 steps; retract 20",
            }
        ),
    )


def vllm_llama_3_2_1b_fp8_8gb() -> EngineProfile:
    """The same model and GPU share under vLLM's V1 scheduler.

    Pool, weights and step costs as :func:`sglang_llama_3_2_1b_fp8_8gb` (the same 40 % of the
    GPU, as ``--gpu-memory-utilization 0.4``); ``max_num_batched_tokens`` 2048 and
    ``max_num_seqs`` 256: vLLM's defaults for the OpenAI server on a GPU under 70 GiB
    (``vllm/engine/arg_utils.py``); decode and prefill chunks share every step
    (``vllm/v1/core/sched/scheduler.py`` at 00024d314514900f361ad072af6931e403b7f589).
    """
    base = sglang_llama_3_2_1b_fp8_8gb()
    sources = dict(base.sources)
    sources.update(
        {
            "max_running": "vLLM arg_utils: max_num_seqs 256 (OpenAI server)",
            "step_tokens": "vLLM arg_utils: max_num_batched_tokens 2048 (OpenAI server, < 70 GiB)",
            "mixed": "vLLM V1: running requests' decode tokens and prefill chunks in one step",
        }
    )
    sources.pop("new_token_ratio")
    return base.with_changes(
        name="vllm-llama-3.2-1b-fp8-8gb",
        style="vllm",
        max_running=256,
        step_tokens=2048,
        mixed=True,
        sources=MappingProxyType(sources),
    )


def llamacpp_smollm2_135m_cpu() -> EngineProfile:
    """llama.cpp's ``llama-server`` with SmolLM2-135M on this machine's CPU (2 threads).

    * ``llama-server -m model.gguf -c 8192 -np 4 -t 2`` (REFERENCES.md): 4 slots, the 8192
      context tokens split among them (2048 each; ``kv_unified`` is off with an explicit ``-np``);
      ``--batch-size`` 2048, ``--slot-prompt-similarity`` 0.1 and ``--cache-ram`` 8192 MiB are
      llama-server's defaults in the llama.cpp that llama-cpp-python 0.3.36 vendors
      (``common/common.h``); 8192 MiB of 23,040-byte tokens (F16 KV) is 372,827 tokens, which
      the cache takes as its token limit (``server_prompt_cache::update``).
    * Measured here (REFERENCES.md): ~150 prompt tokens/s and ~60 generated tokens/s for one
      request. On a CPU a token costs about the same compute in prefill and decode, so
      compute = 1/150 s per token and a step's fixed part is what one decoded token costs
      beyond that: 1/60 - 1/150 = 10 ms.
    * Context: attention reads K and V per context token: 4 x 30 layers x 9 heads x 64 = 69 k
      FLOP per token of context against 2 x 106 M = 212 M FLOP of projections per token, so a
      token of context costs 69 k / 212 M of a computed token.
    """
    shape = SMOLLM2_135M
    compute = 1.0 / 150.0
    attention_flops = 4 * shape.layers * shape.heads * shape.head_dim
    costs = StepCosts(
        fixed_s=1.0 / 60.0 - compute,
        compute_s_per_token=compute,
        context_s_per_token=compute * attention_flops / shape.flops_per_token,
    )
    return EngineProfile(
        name="llamacpp-smollm2-135m-cpu",
        style="llamacpp",
        pool_tokens=8192,
        max_running=4,
        step_tokens=2048,
        mixed=True,
        costs=costs,
        slot_prompt_similarity=0.1,
        ram_cache_tokens=int(8192 * 1024 * 1024 // shape.kv_bytes_per_token),
        sources=MappingProxyType(
            {
                "pool_tokens": "llama-server -c 8192 (REFERENCES.md), split over -np 4 slots",
                "max_running": "llama-server -np 4 (REFERENCES.md)",
                "step_tokens": "llama-server default --batch-size 2048",
                "compute_s_per_token": "measured ~150 prompt tokens/s on 2 threads (REFERENCES.md)",
                "fixed_s": "measured ~60 generated tokens/s for one request: 1/60 - 1/150 s",
                "context_s_per_token": "attention FLOPs per context token / projection FLOPs per token",
                "slot_prompt_similarity": "llama-server default 0.1 (common.h, llama-cpp-python 0.3.36)",
                "ram_cache_tokens": "llama-server default --cache-ram 8192 MiB / 23,040 bytes per token",
            }
        ),
    )


def vllm_qwen3_8b_bf16_rtx5090() -> EngineProfile:
    """Qwen3-8B in BF16 under vLLM on one RTX 5090: the engine of ThunderAgent's ToolOrchestra
    (HLE) serving runs (arXiv 2602.13692, section 5.1: "Qwen3-8B with FP16 precision hosted on one
    RTX 5090"; its repository's ``examples/inference/ToolOrchestra``: ``vllm serve`` 0.10.1 with
    ``--enable-prefix-caching`` and no other sizing flag, so vLLM's defaults).

    * GPU: RTX 5090, 32 GiB GDDR7 on a 512-bit bus at 28 Gbps = 1,792 GB/s; 170 Blackwell SMs at
      up to 2.41 GHz: 170 x 512 BF16 FLOP/clock/SM with FP32 accumulation (GeForce rate, half the
      FP16-accumulate rate) ~ 210 TFLOPS (NVIDIA's specifications).
    * Achieved fractions as the first profile's (:func:`sglang_llama_3_2_1b_fp8_8gb`): 80 % of
      peak bandwidth, 50 % of peak FLOPS.
    * Pool: ``(32 GiB x gpu_memory_utilization 0.9 - weights - 1.5 GiB) / KV bytes per token``:
      vLLM's default utilization; weights 8.19 B BF16 parameters = 16.4 GB; 1.5 GiB for what
      vLLM's profiling run finds beyond the weights (activations of a 2,048-token step, CUDA
      graphs, the non-torch allocations): an estimate, not a published figure; KV: 2 x 36 layers
      x 8 heads x 128 x 2 bytes = 144 KiB per token.
    * ``max_num_batched_tokens`` 2048 and ``max_num_seqs`` 256: vLLM's OpenAI-server defaults on a
      GPU under 70 GiB, as :func:`vllm_llama_3_2_1b_fp8_8gb`.
    * Step: fixed = weights read once (16.4 GB at 1,434 GB/s = 11.4 ms) + 1 ms of scheduler and
      launch overhead; compute = 13.9 GFLOP per token at 105 TFLOPS = 133 us; context = 144 KiB
      per token at 1,434 GB/s = 0.10 us per token of KV read.
    """
    shape = QWEN3_8B
    bandwidth = 1792e9 * 0.8
    flops = 170 * 512 * 2.41e9 * 0.5
    pool = int((32 * GIB * 0.9 - shape.weights_bytes - 1.5 * GIB) // shape.kv_bytes_per_token)
    costs = StepCosts(
        fixed_s=shape.weights_bytes / bandwidth + 0.001,
        compute_s_per_token=shape.flops_per_token / flops,
        context_s_per_token=shape.kv_bytes_per_token / bandwidth,
    )
    return EngineProfile(
        name="vllm-qwen3-8b-bf16-rtx5090",
        style="vllm",
        pool_tokens=pool,
        max_running=256,
        step_tokens=2048,
        mixed=True,
        costs=costs,
        sources=MappingProxyType(
            {
                "pool_tokens": "(32 GiB x gpu_memory_utilization 0.9 (vLLM default) - 16.4 GB weights - "
                "1.5 GiB profiled activations (estimate)) / 144 KiB per token (Qwen3-8B config.json)",
                "max_running": "vLLM arg_utils: max_num_seqs 256 (OpenAI server, < 70 GiB)",
                "step_tokens": "vLLM arg_utils: max_num_batched_tokens 2048 (OpenAI server, < 70 GiB)",
                "mixed": "vLLM V1: running requests' decode tokens and prefill chunks in one step",
                "fixed_s": "16.4 GB weights at 80 % of 1,792 GB/s (RTX 5090) + 1 ms overhead",
                "compute_s_per_token": "13.9 GFLOP/token at 50 % of 210 TFLOPS BF16 (170 Blackwell SMs)",
                "context_s_per_token": "144 KiB KV per token at 80 % of 1,792 GB/s",
                "workload": "ThunderAgent arXiv 2602.13692 section 5.1 (ToolOrchestra on HLE)",
            }
        ),
    )


PROFILES: Mapping[str, EngineProfile] = MappingProxyType(
    {
        p.name: p
        for p in (
            sglang_llama_3_2_1b_fp8_8gb(),
            vllm_llama_3_2_1b_fp8_8gb(),
            llamacpp_smollm2_135m_cpu(),
            vllm_qwen3_8b_bf16_rtx5090(),
        )
    }
)


def profile(name: str) -> EngineProfile:
    """The named profile; raises ``ValueError`` naming the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown engine profile {name!r}; known: {', '.join(PROFILES)}") from None
