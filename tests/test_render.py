"""The one rendering of tool-use conversations: layout, loss masks, rollout parity and call parsing.

Runs on the tiny tokenizer trained here (no downloads): ``<|im_start|>``/``<|im_end|>`` are single
special tokens and the ``<tool_call>`` markers single added tokens.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from environments.render import (
    IM_END,
    ToolCall,
    assistant_text,
    encode_segment,
    generation_header,
    im_end_id,
    observation_ids,
    parse_assistant,
    render,
    render_text,
    segments,
    tools_block,
    turn_suffix_ids,
    user_ids,
)
from trainer.tiny import build_tiny

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "find_flight",
            "description": "Flights between two cities.",
            "parameters": {
                "type": "object",
                "properties": {"origin": {"type": "string"}, "destination": {"type": "string"}},
                "required": ["origin", "destination"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_price",
            "description": "Price of a flight.",
            "parameters": {"type": "object", "properties": {"flight": {"type": "string"}}},
        },
    },
]


def _call(name: str, arguments: dict[str, Any], i: int) -> dict[str, Any]:
    return {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


# system, user, assistant with 2 calls, 2 tool outputs, an assistant turn with an invalid call,
# its error output, a final answer, a user follow-up and a last answer.
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You book flights."},
    {"role": "user", "content": "Cheapest flight from Oslo to Rome?"},
    {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            _call("find_flight", {"origin": "Oslo", "destination": "Rome"}, 0),
            _call("get_price", {"flight": "OS-12"}, 1),
        ],
    },
    {"role": "tool", "tool_call_id": "c0", "content": '["OS-12", "OS-14"]'},
    {"role": "tool", "tool_call_id": "c1", "content": '{"price": 120}'},
    {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "get_price", "arguments": {flight: OS-14}\n</tool_call>',
    },
    {"role": "tool", "content": "error: invalid tool call"},
    {"role": "assistant", "content": "OS-12 at 120 EUR."},
    {"role": "user", "content": "Thanks, book it."},
    {"role": "assistant", "content": "Booked."},
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> PreTrainedTokenizerBase:
    path = build_tiny(tmp_path_factory.mktemp("tiny") / "model", [render_text(CONVERSATION, TOOLS)])
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def _trained_runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    """Maximal runs of consecutive trained tokens."""
    runs: list[list[int]] = []
    previous = 0
    for token, m in zip(ids, mask, strict=True):
        if m and not previous:
            runs.append([])
        if m:
            runs[-1].append(token)
        previous = m
    return runs


def test_markers_are_single_tokens(tok: PreTrainedTokenizerBase) -> None:
    for marker in [
        "<|im_start|>",
        IM_END,
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
    ]:
        assert len(encode_segment(tok, marker)) == 1, marker
    assert im_end_id(tok) == tok.eos_token_id


def test_layout_text() -> None:
    text = render_text(CONVERSATION, TOOLS)
    assert text.startswith("<|im_start|>system\nYou book flights.\n\n# Tools\n\n")
    assert tools_block(TOOLS) in text
    # The two calls of one turn, content first, one block per call; arguments re-dumped as JSON.
    assert (
        "<|im_start|>assistant\nLet me look.\n<tool_call>\n"
        '{"name": "find_flight", "arguments": {"origin": "Oslo", "destination": "Rome"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_price", "arguments": {"flight": "OS-12"}}\n</tool_call><|im_end|>\n'
    ) in text
    # Consecutive tool outputs share one user segment.
    assert (
        '<|im_start|>user\n<tool_response>\n["OS-12", "OS-14"]\n</tool_response>\n'
        '<tool_response>\n{"price": 120}\n</tool_response><|im_end|>\n'
    ) in text
    assert text.endswith("<|im_start|>assistant\nBooked.<|im_end|>\n")
    # No tools: no tools block. Tools without a system message: a system segment of only the block.
    assert "# Tools" not in render_text(CONVERSATION, [])
    bare = render_text(CONVERSATION[1:2], TOOLS)
    assert bare.startswith(f"<|im_start|>system\n{tools_block(TOOLS)}<|im_end|>\n<|im_start|>user\n")


def test_mask_covers_exactly_the_assistant_bodies(tok: PreTrainedTokenizerBase) -> None:
    rendered = render(tok, CONVERSATION, TOOLS)
    assert len(rendered.input_ids) == len(rendered.loss_mask)
    # Per-segment tokenization, concatenated; decoding gives the rendered text back.
    segs = segments(CONVERSATION, TOOLS)
    assert rendered.input_ids == [t for s in segs for t in encode_segment(tok, s.text)]
    assert tok.decode(rendered.input_ids) == render_text(CONVERSATION, TOOLS)
    # Each trained run is one assistant body + <|im_end|>: headers, "\n" and tool responses are out.
    bodies = [assistant_text(m) + IM_END for m in CONVERSATION if m["role"] == "assistant"]
    runs = _trained_runs(rendered.input_ids, rendered.loss_mask)
    assert runs == [encode_segment(tok, b) for b in bodies]
    assert sum(rendered.loss_mask) == sum(len(encode_segment(tok, b)) for b in bodies)
    untrained = tok.decode([t for t, m in zip(rendered.input_ids, rendered.loss_mask, strict=True) if not m])
    assert "<tool_response>" in untrained and "Let me look." not in untrained
    assert untrained.count("<|im_start|>assistant\n") == 4


def test_role_target_user_trains_user_turns_not_tool_responses(tok: PreTrainedTokenizerBase) -> None:
    rendered = render(tok, CONVERSATION, TOOLS, role_target="user")
    runs = _trained_runs(rendered.input_ids, rendered.loss_mask)
    users = [m["content"] + IM_END for m in CONVERSATION if m["role"] == "user"]
    assert runs == [encode_segment(tok, u) for u in users]
    assert all("<tool_response>" not in tok.decode(r) for r in runs)


def test_rollout_layout_equals_render(tok: PreTrainedTokenizerBase) -> None:
    """Token by token, a rollout of this conversation builds exactly render()'s ids and mask."""
    prompt = CONVERSATION[:2]
    ids = render(tok, prompt, TOOLS).input_ids + generation_header(tok)
    mask = [0] * len(ids)
    rest = CONVERSATION[2:]
    i = 0
    while i < len(rest):
        message = rest[i]
        assert message["role"] == "assistant"
        generated = [*encode_segment(tok, assistant_text(message)), im_end_id(tok)]  # the model's turn
        ids += generated
        mask += [1] * len(generated)
        i += 1
        if i == len(rest):
            ids += turn_suffix_ids(tok)
            mask += [0] * len(turn_suffix_ids(tok))
            break
        outputs = []
        while i < len(rest) and rest[i]["role"] == "tool":
            outputs.append(rest[i]["content"])
            i += 1
        observed = observation_ids(tok, outputs) if outputs else user_ids(tok, rest[i]["content"])
        if not outputs:
            i += 1
        between = turn_suffix_ids(tok) + observed + generation_header(tok)
        ids += between
        mask += [0] * len(between)
    rendered = render(tok, CONVERSATION, TOOLS)
    assert ids == rendered.input_ids
    assert mask == rendered.loss_mask


def test_chat_template_matches_render(tok: PreTrainedTokenizerBase) -> None:
    text = tok.apply_chat_template(CONVERSATION, tools=[*TOOLS], tokenize=False)
    assert text == render_text(CONVERSATION, TOOLS)
    prompt = tok.apply_chat_template(
        CONVERSATION[:2], tools=[*TOOLS], tokenize=False, add_generation_prompt=True
    )
    assert prompt == render_text(CONVERSATION[:2], TOOLS) + "<|im_start|>assistant\n"
    assert tok.apply_chat_template(CONVERSATION[1:2], tokenize=False) == render_text(CONVERSATION[1:2], [])


# Parsing ---------------------------------------------------------------------
def test_parse_round_trips_rendered_calls() -> None:
    message = CONVERSATION[2]
    parsed = parse_assistant(assistant_text(message))
    assert parsed.content == "Let me look."
    assert parsed.tool_calls == [
        ToolCall(name="find_flight", arguments={"origin": "Oslo", "destination": "Rome"}),
        ToolCall(name="get_price", arguments={"flight": "OS-12"}),
    ]
    assert parsed.invalid_calls == [] and parsed.emitted == 2
    assert assistant_text(parsed.to_message()) == assistant_text(message)


def test_parse_several_calls_and_text_outside() -> None:
    text = (
        'First.<tool_call>{"name": "a", "arguments": {}}</tool_call> middle '
        '<tool_call>\n{"name": "b", "arguments": {"x": [1, 2]}}\n</tool_call>\nLast.'
    )
    parsed = parse_assistant(text)
    assert [c.name for c in parsed.tool_calls] == ["a", "b"]
    assert parsed.tool_calls[1].arguments == {"x": [1, 2]}
    assert parsed.content == "First. middle \nLast."


@pytest.mark.parametrize(
    "block",
    [
        '{"name": "a", "arguments": {"x": 1}',  # invalid JSON
        '{"arguments": {"x": 1}}',  # no name
        '{"name": "", "arguments": {}}',  # empty name
        '{"name": 3, "arguments": {}}',  # name not a string
        '{"name": "a"}',  # no arguments
        '{"name": "a", "arguments": [1]}',  # arguments not an object
        '{"name": "a", "arguments": "{not json"}',  # arguments string that is not JSON
        '{"name": "a", "arguments": "[1, 2]"}',  # arguments string that is not an object
        '["a", {}]',  # not an object
        "",  # empty block
    ],
)
def test_parse_invalid_calls(block: str) -> None:
    parsed = parse_assistant(f"ok <tool_call>\n{block}\n</tool_call>")
    assert parsed.tool_calls == []
    assert parsed.invalid_calls == [block]
    assert parsed.emitted == 1 and parsed.content == "ok"


def test_parse_arguments_given_as_json_string() -> None:
    parsed = parse_assistant('<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>')
    assert parsed.tool_calls == [ToolCall(name="a", arguments={"x": 1})]


def test_parse_mixed_valid_and_invalid_keeps_order_and_counts_all() -> None:
    text = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
        "<tool_call>oops</tool_call>"
        '<tool_call>{"name": "b", "arguments": {}}</tool_call>'
    )
    parsed = parse_assistant(text)
    assert [c.name for c in parsed.tool_calls] == ["a", "b"]
    assert parsed.invalid_calls == ["oops"] and parsed.emitted == 3 and parsed.content == ""


def test_parse_unclosed_block_and_plain_text() -> None:
    cut = parse_assistant('Calling.\n<tool_call>\n{"name": "a", "arguments": {"q": "x"}}')
    assert cut.tool_calls == [ToolCall(name="a", arguments={"q": "x"})] and cut.content == "Calling."
    truncated = parse_assistant('<tool_call>\n{"name": "a", "argu')
    assert truncated.tool_calls == [] and truncated.invalid_calls == ['{"name": "a", "argu']
    plain = parse_assistant(f"  The answer is 4.{IM_END}")
    assert plain.content == "The answer is 4." and plain.emitted == 0


def test_assistant_text_arguments_forms() -> None:
    as_dict = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"function": {"name": "a", "arguments": {"x": 1}}}],
    }
    compact = {"role": "assistant", "tool_calls": [{"function": {"name": "a", "arguments": '{"x":1}'}}]}
    expected = '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>'
    assert assistant_text(as_dict) == assistant_text(compact) == expected
    broken = {"role": "assistant", "tool_calls": [{"function": {"name": "a", "arguments": "{x"}}]}
    assert parse_assistant(assistant_text(broken)).invalid_calls != []
    assert assistant_text({"role": "assistant", "content": [{"type": "text", "text": "hi"}]}) == "hi"


def test_unknown_role_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown message role"):
        segments([{"role": "narrator", "content": "x"}], [])
