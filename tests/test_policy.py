"""The tiny policy: built offline from text (and from the lake), reloaded, sampled with the hf backend.

Real torch and transformers on a 2-layer, hidden-64 Llama; no downloads.
"""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from transformers import AutoModelForCausalLM, AutoTokenizer

from arena.config import TrainSettings
from arena.records.envs import VerifiedSample
from arena.records.sft import SftSample
from arena.records.tools import NormalizedTool, ToolDocFormat, ToolFunction, ToolServer
from environments.render import IM_END, assistant_text, encode_segment, generation_header, render
from lake.parquet import LakeRow, LakeWriter
from lake.store import LocalStore
from trainer import policy
from trainer.learner import Learner
from trainer.policy import Generation, HfBackend, load_policy, stop_ids_of, token_logprobs
from trainer.tiny import SPECIAL_TOKENS, build_tiny, lake_texts, train_tokenizer

TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Status of an order.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
    },
}
PROMPT = [{"role": "user", "content": "Where is order A-17?"}]
ANSWER = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"function": {"name": "lookup_order", "arguments": '{"order_id": "A-17"}'}}],
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", ["Where is my order? lookup_order"], seed=7)


def _prompt_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    return render(tokenizer, messages, [TOOL]).input_ids + generation_header(tokenizer)


# Building --------------------------------------------------------------------
def test_builds_offline_reloads_and_depends_only_on_seed(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    tokenizer = AutoTokenizer.from_pretrained(str(tiny))
    model = AutoModelForCausalLM.from_pretrained(str(tiny))
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 2
    assert model.config.vocab_size == len(tokenizer)
    assert tokenizer.eos_token == IM_END and tokenizer.pad_token == "<|pad|>"
    for special in SPECIAL_TOKENS:
        assert len(encode_segment(tokenizer, special)) == 1
    assert stop_ids_of(tokenizer) == [tokenizer.eos_token_id]

    same = AutoModelForCausalLM.from_pretrained(
        str(build_tiny(tmp_path / "same", ["Where is my order? lookup_order"], seed=7))
    )
    other = AutoModelForCausalLM.from_pretrained(
        str(build_tiny(tmp_path / "other", ["Where is my order? lookup_order"], seed=8))
    )
    weights, same_weights, other_weights = (m.state_dict() for m in (model, same, other))
    assert all(torch.equal(weights[k], same_weights[k]) for k in weights)
    assert not torch.equal(weights["model.embed_tokens.weight"], other_weights["model.embed_tokens.weight"])


def _row(topic: str, key: str, offset: int, value: Any) -> LakeRow:
    return LakeRow(
        key=key, topic=topic, partition=0, offset=offset, timestamp_ms=1_700_000_000_000,
        value=value.model_dump_json().encode(),
    )  # fmt: skip


def test_tokenizer_trains_on_lake_texts(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "lake")
    assert lake_texts(store) == []  # an empty lake: the tokenizer still trains on the built-in corpus

    conversation = [*PROMPT, ANSWER, {"role": "tool", "content": '{"status": "shipped"}'}]
    sft = SftSample(sample_id="s1", messages=conversation, tools=[TOOL], role_target="agent", source="astra")
    verified = VerifiedSample(
        sample_id="v1", kind="qa", prompt=PROMPT, tools=[TOOL], env_ref="env-1",
        reward_spec={"jobs": [{"index": 0, "question": "q", "answer": "shipped"}]}, domain="ecommerce",
    )  # fmt: skip
    tools = [
        NormalizedTool(
            function=ToolFunction(name=f"quasarwidget_{n}", description="x", parameters={"type": "object"})
        )
        for n in ("alpha", "beta", "gamma")
    ]
    server = ToolServer(
        server_id="srv1", name="widgets", source="docs.json", format=ToolDocFormat.openai,
        domain="ecommerce", domain_score=0.9, tools=tools,
    )  # fmt: skip
    writer = LakeWriter(store)
    writer.write("samples.sft", [_row("samples.sft", "s1", 0, sft)])
    writer.write("samples.verified", [_row("samples.verified", "v1", 0, verified)])
    writer.write("tools.servers", [_row("tools.servers", "srv1", 0, server)])

    texts = lake_texts(store)
    assert len(texts) == 5  # 1 conversation, 1 prompt, 3 tools
    assert texts[0].startswith("<|im_start|>system\n# Tools") and "<tool_response>" in texts[0]
    assert any("quasarwidget_beta" in t for t in texts)
    assert lake_texts(store, limit=2) == texts[:2]

    trained = train_tokenizer(texts * 20, vocab_size=600)
    baseline = train_tokenizer([], vocab_size=600)
    word = "quasarwidget"  # only in the lake: merged into few tokens only when trained on it
    assert len(trained.encode(word).ids) < len(baseline.encode(word).ids)
    for marker in [*SPECIAL_TOKENS, "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]:
        assert len(trained.encode(marker).ids) == 1, marker
    assert trained.token_to_id(IM_END) is not None


# Sampling --------------------------------------------------------------------
@pytest.mark.parametrize(
    "logits_bytes", [policy.LOGITS_BYTES, 0], ids=["from-sampling-logits", "second-pass"]
)
def test_hf_backend_is_seeded_and_logprobs_equal_token_logprobs(
    tiny: Path, logits_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(policy, "LOGITS_BYTES", logits_bytes)
    model, tokenizer = load_policy(tiny)
    backend = HfBackend(model, tokenizer, stop_ids_of(tokenizer))
    prompts = [_prompt_ids(tokenizer, PROMPT), _prompt_ids(tokenizer, [{"role": "user", "content": "Hi"}])]
    assert len(prompts[0]) != len(prompts[1])  # the batch is padded

    first = backend.generate(prompts, max_new_tokens=16, temperature=1.0, seed=11)
    again = backend.generate(prompts, max_new_tokens=16, temperature=1.0, seed=11)
    other = backend.generate(prompts, max_new_tokens=16, temperature=1.0, seed=12)
    assert first == again
    assert first != other
    for prompt, gen in zip(prompts, first, strict=True):
        assert 0 < len(gen.token_ids) <= 16 and len(gen.logprobs) == len(gen.token_ids)
        assert gen.finished == (gen.token_ids[-1] in backend.stop_ids)
        ids = torch.tensor([prompt + gen.token_ids])
        with torch.no_grad():
            expected = token_logprobs(model, ids, torch.ones_like(ids))[0, len(prompt) :]
        torch.testing.assert_close(torch.tensor(gen.logprobs), expected)

    greedy = backend.generate(prompts, max_new_tokens=8, temperature=0.0, seed=1)
    assert greedy == backend.generate(prompts, max_new_tokens=8, temperature=0.0, seed=2)


def _turns(backend: HfBackend, prompts: list[list[int]], temperature: float) -> list[list[Generation]]:
    """Three turns: each next prompt is the last one, what it generated, and a fixed observation."""
    turns = []
    for turn in range(3):
        out = backend.generate(prompts, max_new_tokens=6 + 4 * turn, temperature=temperature, seed=turn)
        turns.append(out)
        prompts = [
            p + g.token_ids + [5 + i, 9, 14 + turn] for i, (p, g) in enumerate(zip(prompts, out, strict=True))
        ]
    return turns


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_prefix_cache_gives_what_running_every_context_in_full_gives(tiny: Path, temperature: float) -> None:
    model, tokenizer = load_policy(tiny)
    cached = HfBackend(model, tokenizer, stop_ids_of(tokenizer))
    plain = HfBackend(model, tokenizer, stop_ids_of(tokenizer), prefix_cache_bytes=0)
    hi = _prompt_ids(tokenizer, [{"role": "user", "content": "Hi"}])
    prompts = [_prompt_ids(tokenizer, PROMPT)] * 2 + [hi] * 2  # two groups of G = 2, unequal lengths
    with_cache, without = _turns(cached, prompts, temperature), _turns(plain, prompts, temperature)
    assert cached.prefix_cache is not None and len(cached.prefix_cache) == 4  # one entry per rollout
    for turn_a, turn_b in zip(with_cache, without, strict=True):
        assert [g.token_ids for g in turn_a] == [g.token_ids for g in turn_b]
        for a, b in zip(turn_a, turn_b, strict=True):
            torch.testing.assert_close(
                torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=1e-4, atol=1e-4
            )


def test_prefix_cache_is_dropped_when_the_weights_change(tiny: Path) -> None:
    model, tokenizer = load_policy(tiny)
    backend = HfBackend(model, tokenizer, stop_ids_of(tokenizer))
    prompt = _prompt_ids(tokenizer, PROMPT)
    backend.generate([prompt], max_new_tokens=4, temperature=0.0, seed=0)
    assert backend.prefix_cache is not None and len(backend.prefix_cache) == 1
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)  # what an optimizer step does: an in-place change
    (after,) = backend.generate([prompt], max_new_tokens=8, temperature=0.0, seed=0)
    (fresh,) = HfBackend(model, tokenizer, stop_ids_of(tokenizer), prefix_cache_bytes=0).generate(
        [prompt], max_new_tokens=8, temperature=0.0, seed=0
    )
    assert after.token_ids == fresh.token_ids
    torch.testing.assert_close(torch.tensor(after.logprobs), torch.tensor(fresh.logprobs))


def test_no_prefix_cache_for_sliding_window_attention(tiny: Path) -> None:
    from transformers import MistralConfig

    _, tokenizer = load_policy(tiny)
    small = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
    sliding = AutoModelForCausalLM.from_config(
        MistralConfig(**small, num_key_value_heads=1, sliding_window=8)
    )
    assert (
        HfBackend(sliding, tokenizer, stop_ids_of(tokenizer)).prefix_cache is None
    )  # a window sees other tokens
    model, _ = load_policy(tiny)
    assert HfBackend(model, tokenizer, stop_ids_of(tokenizer)).prefix_cache is not None


def test_token_logprobs_ignores_padding_and_starts_at_zero(tiny: Path) -> None:
    model, _ = load_policy(tiny)
    row = torch.tensor([[5, 9, 14, 3, 22]])
    with torch.no_grad():
        plain = token_logprobs(model, row, torch.ones_like(row))
        left = token_logprobs(
            model, torch.tensor([[0, 0, 5, 9, 14, 3, 22]]), torch.tensor([[0, 0, 1, 1, 1, 1, 1]])
        )
        right = token_logprobs(
            model, torch.tensor([[5, 9, 14, 3, 22, 0]]), torch.tensor([[1, 1, 1, 1, 1, 0]])
        )
    assert plain[0, 0] == 0 and (plain[0, 1:] < 0).all()
    torch.testing.assert_close(left[:, 2:], plain)
    torch.testing.assert_close(right[:, :5], plain)
    assert left[0, :2].eq(0).all() and right[0, 5] == 0


def _fit(model: torch.nn.Module, ids: list[int], mask: list[int], steps: int) -> list[float]:
    """A few SFT steps on one rendered conversation (assistant-only loss); returns the losses."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    input_ids = torch.tensor([ids])
    loss_mask = torch.tensor([mask], dtype=torch.float32)
    losses = []
    for _ in range(steps):
        logprobs = token_logprobs(model, input_ids, torch.ones_like(input_ids))
        loss = -(logprobs * loss_mask).sum() / loss_mask.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_generation_stops_at_im_end_and_weights_sync(tiny: Path) -> None:
    torch.manual_seed(0)
    model, tokenizer = load_policy(tiny)
    rendered = render(tokenizer, [*PROMPT, ANSWER], [TOOL])
    losses = _fit(model, rendered.input_ids, rendered.loss_mask, steps=150)
    assert losses[-1] < 0.01 * losses[0]  # token_logprobs is differentiable; the fit works

    backend = HfBackend(model, tokenizer, stop_ids_of(tokenizer))
    target = encode_segment(tokenizer, assistant_text(ANSWER) + IM_END)
    prompt = _prompt_ids(tokenizer, PROMPT)
    (greedy,) = backend.generate([prompt], max_new_tokens=len(target) + 8, temperature=0.0, seed=0)
    assert greedy == Generation(token_ids=target, logprobs=greedy.logprobs, finished=True)
    assert tokenizer.decode(greedy.token_ids[:-1]) == assistant_text(ANSWER)
    (sampled,) = backend.generate([prompt], max_new_tokens=len(target) + 8, temperature=1.0, seed=5)
    assert sampled.finished and sampled.token_ids[-1] == tokenizer.eos_token_id

    backend.load_weights(model)  # shares the module: nothing to copy
    fresh_model, _ = load_policy(tiny)
    fresh = HfBackend(fresh_model, tokenizer, stop_ids_of(tokenizer))
    assert fresh.generate([prompt], max_new_tokens=len(target), temperature=0.0, seed=0) != [greedy]
    fresh.load_weights(model)
    assert fresh.generate([prompt], max_new_tokens=len(target) + 8, temperature=0.0, seed=0) == [greedy]


def test_build_tiny_metadata(tiny: Path) -> None:
    meta = json.loads((tiny / "arena_tiny.json").read_text())
    assert meta["seed"] == 7 and meta["hidden_size"] == 64 and meta["layers"] == 2


# Device and precision --------------------------------------------------------
def test_device_and_precision_settings_resolve_on_a_cpu_machine() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: auto picks it")
    assert policy.resolve_device("auto") == "cpu"
    assert policy.resolve_precision("auto", "cpu") == "fp32"
    assert policy.resolve_precision("bf16", "cpu") == "bf16"
    with pytest.raises(ValueError, match="no GPU"):
        policy.resolve_device("cuda")


def test_vllm_engine_args_take_the_policy_precision_and_memory_share_and_yield_to_the_user() -> None:
    assert policy.vllm_engine_args("bf16", 0.4, {}) == {"dtype": "bfloat16", "gpu_memory_utilization": 0.4}
    chosen = policy.vllm_engine_args("fp32", 0.5, {"dtype": "float16", "enforce_eager": True})
    assert chosen == {"dtype": "float16", "gpu_memory_utilization": 0.5, "enforce_eager": True}
    with pytest.raises(ValidationError, match="vllm_gpu_memory"):
        TrainSettings(vllm_gpu_memory=1.0)  # the policy and its optimizer need the rest


def test_learner_starts_a_vllm_engine_with_the_train_settings(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No GPU or vllm here: a stand-in ``vllm`` module records what the engine is started with."""
    started: list[dict[str, Any]] = []

    class LLM:
        def __init__(self, **kwargs: Any) -> None:
            started.append(kwargs)

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM))
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # the backend sets it; restored after
    cfg = TrainSettings(
        backend="vllm",
        device="cpu",
        precision="bf16",
        vllm_gpu_memory=0.35,
        vllm_engine_args={"enforce_eager": True},
    )
    learner = Learner.load(tiny, cfg)
    assert started == [
        {"model": str(tiny), "dtype": "bfloat16", "gpu_memory_utilization": 0.35, "enforce_eager": True}
    ]
    assert isinstance(learner.backend, policy.VllmBackend)
    assert learner.backend.stop_ids == stop_ids_of(learner.tokenizer)


def test_bf16_autocast_generates_and_trains_with_fp32_weights(tiny: Path) -> None:
    model, tokenizer = load_policy(tiny)
    backend = HfBackend(model, tokenizer, stop_ids_of(tokenizer), precision="bf16")
    prompt = _prompt_ids(tokenizer, PROMPT)
    (gen,) = backend.generate([prompt], max_new_tokens=8, temperature=1.0, seed=3)
    assert gen.token_ids and all(lp <= 0 for lp in gen.logprobs)
    ids = torch.tensor([prompt + gen.token_ids])
    with policy.autocast("cpu", "bf16"):
        low = token_logprobs(model, ids, torch.ones_like(ids))
    full = token_logprobs(model, ids, torch.ones_like(ids))
    assert low.dtype == torch.float32  # log-softmax in fp32 over bf16 logits
    torch.testing.assert_close(low, full, atol=0.1, rtol=0.05)  # bf16 rounding, not another model
    (-low[0, len(prompt) :].sum()).backward()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


# The update's log-probs --------------------------------------------------------
def test_response_logprobs_run_each_prompt_once_and_match_full_rows(tiny: Path) -> None:
    from trainer.response_logprobs import response_logprobs

    model, _ = load_policy(tiny)
    torch.manual_seed(0)
    vocab = model.config.vocab_size
    a, b = (torch.randint(5, vocab - 5, (n,)).tolist() for n in (30, 17))
    prompts = [a, a, b, a]  # two groups' rows, unequal prompt lengths
    responses = [torch.randint(5, vocab - 5, (n,)).tolist() for n in (6, 9, 4, 1)]

    def full_rows() -> list[torch.Tensor]:
        out = []
        for p, r in zip(prompts, responses, strict=True):
            ids = torch.tensor([p + r])
            out.append(token_logprobs(model, ids, torch.ones_like(ids))[0, len(p) :])
        return out

    got = response_logprobs(model, prompts, responses, pad_id=0)
    for row, expected in zip(got, full_rows(), strict=True):
        torch.testing.assert_close(row[: len(expected)], expected, rtol=1e-4, atol=1e-5)
        assert row[len(expected) :].eq(0).all()  # right padding
    weights = torch.randn(got.shape)
    model.zero_grad()
    sum((row * weights[i, : len(row)]).sum() for i, row in enumerate(full_rows())).backward()
    expected_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    (response_logprobs(model, prompts, responses, pad_id=0) * weights).sum().backward()
    for p, expected_grad in zip(model.parameters(), expected_grads, strict=True):
        torch.testing.assert_close(p.grad, expected_grad, rtol=1e-3, atol=1e-5)  # the shared prompt's sum
