"""The engine model's named profiles: every derived figure, computed again from its sources."""

from __future__ import annotations

import re

import pytest
from engine_model_helpers import by_id, path, run_until_idle

from luftpause.testkit.engine.model import (
    PROFILES,
    EngineModel,
    EngineRequest,
    FirstTokenGenerated,
    RequestFinished,
    profile,
)
from luftpause.testkit.engine.model.profiles import LLAMA_3_2_1B, QWEN3_8B, SMOLLM2_135M

GIB = 1024**3


@pytest.mark.parametrize(
    ("figure", "expected"),
    [
        # meta-llama/Llama-3.2-1B: 1.24 B parameters, of which the tied embedding 128256 x 2048.
        (LLAMA_3_2_1B.params, 1_235_814_400),
        (LLAMA_3_2_1B.other_params - 128256 * 2048, 33 * 2048),  # 2 norms a layer and the final
        # 2 (K, V) x 16 layers x 8 KV heads x 64 head dim x 2 bytes (BF16).
        (LLAMA_3_2_1B.kv_bytes_per_token, 32768),
        # FP8 linear layers (1 byte) + BF16 embedding and norms (2 bytes).
        (LLAMA_3_2_1B.weights_bytes, 973_078_528 + 2 * (262_668_288 + 67_584)),
        # HuggingFaceTB/SmolLM2-135M: 135 M parameters; KV 2 x 30 x 3 x 64 x 2 bytes (F16).
        (SMOLLM2_135M.params, 134_515_008),
        (SMOLLM2_135M.kv_bytes_per_token, 23040),
        # Qwen/Qwen3-8B: 8.19 B parameters (untied 151936 x 4096 embedding and LM head); KV 2 x 36
        # layers x 8 KV heads x 128 x 2 bytes (BF16) = 144 KiB.
        (QWEN3_8B.params, 8_190_726_144),
        (QWEN3_8B.other_params - 2 * 151936 * 4096, 73 * 4096),
        (QWEN3_8B.kv_bytes_per_token, 147456),
    ],
)
def test_model_shapes_give_the_published_sizes(figure: float, expected: float) -> None:
    assert figure == expected


def test_the_sglang_profile_is_derived_from_the_gpu_and_the_model() -> None:
    sglang = profile("sglang-llama-3.2-1b-fp8-8gb")
    assert sglang.style == "sglang" and not sglang.mixed
    # (8 GiB x mem_fraction_static 0.4 - weights) / 32 KiB per token.
    assert sglang.pool_tokens == int((8 * GIB * 0.4 - LLAMA_3_2_1B.weights_bytes) // 32768) == 59125
    assert sglang.step_tokens == 2048  # chunked_prefill_size below 20 GiB
    costs = sglang.costs
    bandwidth = 256e9 * 0.8
    assert costs.fixed_s == pytest.approx(LLAMA_3_2_1B.weights_bytes / bandwidth + 0.001)
    assert costs.context_s_per_token == pytest.approx(32768 / bandwidth)
    assert 1 / costs.compute_s_per_token == pytest.approx(24 * 1024 * 2.37e9 * 0.5 / (2 * 973_078_528))
    # SGLang's new-token ratio: 0.7, floor 0.7 x 0.14, decayed over 600 decode steps.
    assert sglang.init_new_token_ratio == 0.7
    assert sglang.min_new_token_ratio == pytest.approx(0.098)
    assert sglang.new_token_ratio_decay == pytest.approx((0.7 - 0.098) / 600)
    assert set(sglang.sources) >= {"pool_tokens", "step_tokens", "fixed_s", "compute_s_per_token"}


def test_the_vllm_profile_shares_the_hardware_and_takes_vllms_scheduler_defaults() -> None:
    sglang, vllm = profile("sglang-llama-3.2-1b-fp8-8gb"), profile("vllm-llama-3.2-1b-fp8-8gb")
    assert (vllm.style, vllm.mixed, vllm.max_running, vllm.step_tokens) == ("vllm", True, 256, 2048)
    assert (vllm.pool_tokens, vllm.costs) == (sglang.pool_tokens, sglang.costs)


def test_the_thunderagent_calibration_profile_is_derived_from_the_rtx_5090_and_qwen3_8b() -> None:
    qwen = profile("vllm-qwen3-8b-bf16-rtx5090")
    assert (qwen.style, qwen.mixed, qwen.max_running, qwen.step_tokens) == ("vllm", True, 256, 2048)
    # (32 GiB x gpu_memory_utilization 0.9 - BF16 weights - 1.5 GiB) / 144 KiB per token.
    weights = 2 * QWEN3_8B.params
    assert qwen.pool_tokens == int((32 * GIB * 0.9 - weights - 1.5 * GIB) // 147456) == 87698
    bandwidth = 1792e9 * 0.8
    assert qwen.costs.fixed_s == pytest.approx(weights / bandwidth + 0.001)
    assert qwen.costs.context_s_per_token == pytest.approx(147456 / bandwidth)
    assert 1 / qwen.costs.compute_s_per_token == pytest.approx(
        170 * 512 * 2.41e9 * 0.5 / QWEN3_8B.flops_per_token
    )
    assert "workload" in qwen.sources


def test_the_llamacpp_profile_reproduces_the_rates_measured_here() -> None:
    llamacpp = profile("llamacpp-smollm2-135m-cpu")
    assert (llamacpp.max_running, llamacpp.slot_tokens, llamacpp.step_tokens) == (4, 2048, 2048)
    engine = EngineModel(llamacpp)
    engine.submit(EngineRequest("r", path("r", 1500), 121), 0.0)
    events = run_until_idle(engine)
    first, done = by_id(events, FirstTokenGenerated)["r"], by_id(events, RequestFinished)["r"]
    # REFERENCES.md: ~150 prompt tokens/s and ~60 generated tokens/s for one request (2 threads);
    # the context term makes the 1,500-token context a little slower than the bare rate.
    assert 1500 / first.time == pytest.approx(150, rel=0.02)
    assert 120 / (done.time - first.time) == pytest.approx(60, rel=0.2)
    assert 120 / (done.time - first.time) < 60


def test_single_stream_rates_of_the_gpu_profiles_are_in_the_range_of_public_figures() -> None:
    # Not fitted: a check that the derivation gives a 1 B model on a 256 GB/s laptop GPU what
    # public single-stream numbers show (~100-150 tokens/s decode, > 10 k tokens/s prefill).
    for name in ("sglang-llama-3.2-1b-fp8-8gb", "vllm-llama-3.2-1b-fp8-8gb"):
        engine = EngineModel(PROFILES[name])
        engine.submit(EngineRequest("r", path("r", 2000), 257), 0.0)
        events = run_until_idle(engine)
        first, done = by_id(events, FirstTokenGenerated)["r"], by_id(events, RequestFinished)["r"]
        assert 2000 / first.time > 10_000
        assert 100 < 256 / (done.time - first.time) < 150


def test_an_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=re.escape("sglang-llama-3.2-1b-fp8-8gb")):
        profile("h100")
    with pytest.raises(ValueError, match="style"):
        PROFILES["vllm-llama-3.2-1b-fp8-8gb"].with_changes(style="tgi")
