"""A tiny causal LM and a tokenizer trained locally on text (no downloads).

``build_tiny(path, texts)`` trains a byte-level BPE tokenizer (every UTF-8 text encodes) on the
given texts, the render markers and a small built-in corpus, builds a random-init Llama sized to
that vocabulary and saves both with ``save_pretrained``, so ``AutoTokenizer`` /
``AutoModelForCausalLM.from_pretrained(path)`` load it offline. Weights depend only on ``seed``
(given the vocabulary). ``lake_texts(store)`` gathers training text from the lake.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from environments.render import (
    IM_END,
    IM_START,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
    TOOLS_CLOSE,
    TOOLS_HEAD,
    TOOLS_OPEN,
    TOOLS_TAIL,
    render_text,
)

log = logging.getLogger(__name__)

PAD = "<|pad|>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END]
# Markers of the render layout: one token each (added, not special, so decoding keeps them).
MARKER_TOKENS = [
    TOOL_CALL_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_RESPONSE_OPEN,
    TOOL_RESPONSE_CLOSE,
    TOOLS_OPEN,
    TOOLS_CLOSE,
]

_EXAMPLE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
_EXAMPLE_CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}],
    },
    {"role": "tool", "content": '{"temperature": 21, "sky": "clear"}'},
    {"role": "assistant", "content": "It is 21 degrees and clear in Paris."},
]

# Words an LLM of Arena reads and writes: prompts, JSON, tool calls. Enough for sensible merges.
BUILTIN_CORPUS = [
    "You are a careful assistant that answers with one JSON object and nothing else.",
    'Return {"answer": "...", "score": 0.5, "reason": "..."} following the schema.',
    '{"task": "Find the weather in Paris tomorrow", "chain": ["get_city", "get_forecast"]}',
    '{"name": "search_hotels", "arguments": {"city": "Lisbon", "nights": 2}}',
    "The user asks for a restaurant booking; the agent calls the tools and summarises.",
    "Tool results: temperature 21 degrees, humidity 40 percent, light wind from the west.",
    "system user assistant tool function parameters description properties required type",
    "string integer number boolean array object null true false",
    "0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14 -1",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'\"()[]{}<>/\\|-_+=*&^%$#@~`",
    '{"name": "', '", "arguments": {', '"}}', '": "', '", "', "\n</tool_call>", "<tool_call>\n{",
    render_text(_EXAMPLE_CONVERSATION, [_EXAMPLE_TOOL]),
]  # fmt: skip

# The render layout as a chat template (tools, tool calls, tool responses), for serving and
# apply_chat_template. Arguments given as a JSON string are inserted as they are; render() re-dumps
# them, so the two agree when the string is json.dumps output.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(start=0, parts=[]) -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages and messages[0].role == 'system' -%}"
    "{{- messages[0].content + '\\n\\n' -}}{%- set ns.start = 1 -%}"
    "{%- endif -%}"
    "{{- " + json.dumps(TOOLS_HEAD) + " -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- " + json.dumps(TOOLS_TAIL) + " -}}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages[ns.start:] -%}"
    "{%- if message.role == 'tool' -%}"
    "{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user\\n' -}}"
    "{%- else -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_response>\\n' + (message.content or '') + '\\n</tool_response>' -}}"
    "{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- elif message.role == 'assistant' -%}"
    "{%- set ns.parts = [message.content] if message.content else [] -%}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{%- set args = fn.arguments if fn.arguments is string else (fn.arguments | tojson) -%}"
    "{%- set ns.parts = ns.parts + ['<tool_call>\\n{\"name\": ' + (fn.name | tojson) + ', \"arguments\": '"
    " + args + '}\\n</tool_call>'] -%}"
    "{%- endfor -%}"
    "{{- '<|im_start|>assistant\\n' + (ns.parts | join('\\n')) + '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``texts`` + the built-in corpus."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    # Digits one by one (as Llama and Qwen2.5 split them): an id like AG-103 is then AG, -, 1, 0, 3,
    # so copying an id the model never produced is copying digits it has, not a token it never
    # learned to emit (a merged "103" token would be a different output for every id).
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [*BUILTIN_CORPUS * 4, *texts]
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_tokens([AddedToken(m, special=False, normalized=False) for m in MARKER_TOKENS])
    return tok


def build_tiny(
    path: str | Path,
    texts: Iterable[str] = (),
    *,
    seed: int = 0,
    vocab_size: int = 1024,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    chat_template: str | None = None,
) -> Path:
    """Save a tokenizer trained on ``texts`` and a random Llama under ``path``; return the path.

    ``<|im_end|>`` is the eos (generation stops there), ``<|pad|>`` the pad; there is no bos.
    ``chat_template`` defaults to the render layout.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(texts, vocab_size),
        eos_token=IM_END,
        pad_token=PAD,
        model_max_length=1 << 20,
    )
    tokenizer.chat_template = chat_template or CHAT_TEMPLATE
    tokenizer.save_pretrained(out)

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=8192,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out)
    meta = {"seed": seed, "vocab_size": len(tokenizer), "hidden_size": hidden_size, "layers": layers}
    (out / "arena_tiny.json").write_text(json.dumps(meta))
    return out


def _valid_rows(store: Any, topic: str, limit: int) -> list[dict[str, Any]]:
    from lake.parquet import read_topic

    table = read_topic(store, topic)
    rows: list[dict[str, Any]] = table.filter(table["_valid"]).slice(0, limit).to_pylist()
    return rows


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def lake_texts(store: Any, limit: int = 2000) -> list[str]:
    """Up to ``limit`` texts from the lake, round-robin over its sources.

    ``samples.sft`` conversations and ``samples.verified`` prompts rendered exactly as the trainer
    renders them (so the tokenizer learns the real layout), and ``tools.servers`` tool specs.
    An empty lake gives ``[]``.
    """
    sources: list[list[str]] = [[], [], []]
    for row in _valid_rows(store, "samples.sft", limit):
        try:
            sources[0].append(render_text(_json(row["messages"]), _json(row["tools"]) or []))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            log.debug("skipping sft row %s: %s", row.get("_key"), exc)
    for row in _valid_rows(store, "samples.verified", limit):
        try:
            sources[1].append(render_text(_json(row["prompt"]), _json(row["tools"]) or []))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            log.debug("skipping verified row %s: %s", row.get("_key"), exc)
    for row in _valid_rows(store, "tools.servers", limit):
        for tool in _json(row["tools"]) or []:
            function = tool.get("function", {}) if isinstance(tool, dict) else {}
            sources[2].append(json.dumps({"type": "function", "function": function}, ensure_ascii=False))
    texts: list[str] = []
    for i in range(max((len(s) for s in sources), default=0)):
        for source in sources:
            if i < len(source) and len(texts) < limit:
                texts.append(source[i])
    return texts
