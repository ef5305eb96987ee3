"""One rendering of tool-use conversations for training data and rollouts (Hermes / Qwen2.5 style).

Every message is three segments, tokenized separately and concatenated, so SFT data, GRPO rollouts
and the trainer's recomputed log-probs see the same token ids (no BPE merge crosses a segment)::

    <|im_start|>{role}\\n          header, never trained
    {text}<|im_end|>               body, trained when its role is the target
    \\n                            separator, never trained

Tool calls are ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks in the
assistant body; tool outputs are ``<tool_response>`` blocks in a user segment (an observation, never
trained). A rollout builds the same ids turn by turn: ``render(prompt) + generation_header``, the
generated body ending in ``<|im_end|>``, then ``turn_suffix_ids``, ``observation_ids`` and the next
``generation_header``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
TOOLS_OPEN, TOOLS_CLOSE = "<tools>", "</tools>"

# Qwen2.5's tool preamble, verbatim, so a Qwen checkpoint sees the layout it was trained on.
TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

RoleTarget = Literal["agent", "user"]
if TYPE_CHECKING:
    Tokenizer: TypeAlias = PreTrainedTokenizerBase
else:

    def __getattr__(name: str) -> Any:
        """``Tokenizer`` imports transformers on first use: parsing and rendering text need none of
        it, and every stage worker imports this module (transformers costs seconds at start-up)."""
        if name == "Tokenizer":
            from transformers import PreTrainedTokenizerBase

            return PreTrainedTokenizerBase
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


# Parsing ---------------------------------------------------------------------
class ToolCall(BaseModel):
    """A well-formed tool call parsed from (or rendered into) an assistant turn."""

    name: Annotated[str, Field(description="Function name.")]
    arguments: Annotated[dict[str, Any], Field(description="Arguments object.")]


class ParsedTurn(BaseModel):
    """An assistant turn split into its text and its tool calls."""

    content: Annotated[str, Field(description="Text outside <tool_call> blocks, stripped.")]
    tool_calls: Annotated[list[ToolCall], Field(description="Well-formed calls, in order.")]
    invalid_calls: Annotated[
        list[str],
        Field(
            description='Raw text of <tool_call> blocks that are not JSON {"name": str, "arguments": object}.'
        ),
    ]

    @property
    def emitted(self) -> int:
        """Every call the model emitted, valid or not (the ``c`` of the F1 reward)."""
        return len(self.tool_calls) + len(self.invalid_calls)

    def to_message(self) -> dict[str, Any]:
        """The OpenAI assistant message of the valid part (invalid calls have no OpenAI form)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
                }
                for i, c in enumerate(self.tool_calls)
            ]
        return message


def _parse_call(raw: str) -> ToolCall | None:
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    name, arguments = obj.get("name"), obj.get("arguments")
    if isinstance(arguments, str):  # some models double-encode the arguments
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(name, str) or not name.strip() or not isinstance(arguments, dict):
        return None
    return ToolCall(name=name.strip(), arguments=arguments)


def parse_assistant(text: str) -> ParsedTurn:
    """Split generated assistant text into content, valid calls and invalid call blocks.

    A ``<tool_call>`` left open at the end (generation cut off, or the model stopped before the
    closing tag) is still a block: it counts as a call, valid if its JSON is.
    """
    calls: list[ToolCall] = []
    invalid: list[str] = []
    for match in _CALL_BLOCK.finditer(text):
        raw = match.group(1).strip()
        call = _parse_call(raw)
        if call is None:
            invalid.append(raw)
        else:
            calls.append(call)
    content = _CALL_BLOCK.sub("", text.replace(IM_END, "")).strip()
    return ParsedTurn(content=content, tool_calls=calls, invalid_calls=invalid)


# Message text ----------------------------------------------------------------
def message_content(content: Any) -> str:
    """Text of an OpenAI ``content`` (a string, None, or a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return str(content)


def _call_json(call: dict[str, Any]) -> str:
    fn = call.get("function", call)
    arguments = fn.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass  # kept as a string: parse_assistant will report the call as invalid
    return json.dumps({"name": fn.get("name", ""), "arguments": arguments}, ensure_ascii=False)


def assistant_text(message: dict[str, Any]) -> str:
    """The body text (between the header and ``<|im_end|>``) of an OpenAI assistant message.

    Content, then one ``<tool_call>`` block per call, joined by newlines (Qwen2.5's layout).
    """
    parts = [message_content(message.get("content"))]
    for call in message.get("tool_calls") or []:
        parts.append(f"{TOOL_CALL_OPEN}\n{_call_json(call)}\n{TOOL_CALL_CLOSE}")
    return "\n".join(p for p in parts if p)


def tools_block(tools: Sequence[dict[str, Any]]) -> str:
    """The tool list as it appears in the system segment."""
    lines = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
    return TOOLS_HEAD + lines + TOOLS_TAIL


def tool_responses_text(outputs: Sequence[str]) -> str:
    """Body text of the user segment carrying tool outputs."""
    return "\n".join(f"{TOOL_RESPONSE_OPEN}\n{o}\n{TOOL_RESPONSE_CLOSE}" for o in outputs)


# Segments --------------------------------------------------------------------
class Segment(BaseModel):
    """A piece of rendered text tokenized on its own."""

    role: Annotated[str, Field(description="Role of the message it belongs to ('tool' for tool responses).")]
    text: Annotated[str, Field(description="The text.")]
    trainable: Annotated[bool, Field(description="Whether its tokens are in the loss.")]


def _message_segments(role: str, body: str, trainable: bool, header_role: str | None = None) -> list[Segment]:
    return [
        Segment(role=role, text=f"{IM_START}{header_role or role}\n", trainable=False),
        Segment(role=role, text=f"{body}{IM_END}", trainable=trainable),
        Segment(role=role, text="\n", trainable=False),
    ]


def segments(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]], role_target: RoleTarget = "agent"
) -> list[Segment]:
    """The conversation as header/body/separator segments, with the tool list in the system segment.

    ``role_target="agent"`` trains assistant bodies; ``"user"`` trains plain user bodies (the
    user simulator), never tool responses.
    """
    out: list[Segment] = []
    rest = list(messages)
    if tools:
        system = ""
        if rest and rest[0].get("role") == "system":
            system = message_content(rest.pop(0).get("content"))
        body = f"{system}\n\n{tools_block(tools)}" if system else tools_block(tools)
        out += _message_segments("system", body, False)
    i = 0
    while i < len(rest):
        role = rest[i].get("role")
        if role in ("tool", "function"):
            outputs = []
            while i < len(rest) and rest[i].get("role") in ("tool", "function"):
                outputs.append(message_content(rest[i].get("content")))
                i += 1
            out += _message_segments("tool", tool_responses_text(outputs), False, header_role="user")
            continue
        if role == "assistant":
            out += _message_segments("assistant", assistant_text(rest[i]), role_target == "agent")
        elif role == "user":
            out += _message_segments("user", message_content(rest[i].get("content")), role_target == "user")
        elif role in ("system", "developer"):
            out += _message_segments("system", message_content(rest[i].get("content")), False)
        else:
            raise ValueError(f"unknown message role {role!r}")
        i += 1
    return out


def render_text(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]], role_target: RoleTarget = "agent"
) -> str:
    """The rendered conversation as one string (what the tiny tokenizer's chat template produces)."""
    return "".join(s.text for s in segments(messages, tools, role_target))


# Tokens ----------------------------------------------------------------------
class Rendered(BaseModel):
    """Token ids of a conversation and its loss mask."""

    input_ids: Annotated[list[int], Field(description="Token ids.")]
    loss_mask: Annotated[list[int], Field(description="1 where the token is trained, same length.")]


def encode_segment(tokenizer: Tokenizer, text: str) -> list[int]:
    """Ids of one segment: no BOS/EOS added; special tokens in the text map to their ids."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def render(
    tokenizer: Tokenizer,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]],
    role_target: RoleTarget = "agent",
) -> Rendered:
    """Token ids and loss mask of a conversation, one tokenization per segment."""
    segs = segments(messages, tools, role_target)
    if not segs:
        return Rendered(input_ids=[], loss_mask=[])
    encoded = tokenizer([s.text for s in segs], add_special_tokens=False)["input_ids"]
    ids: list[int] = []
    mask: list[int] = []
    for seg, seg_ids in zip(segs, encoded, strict=True):
        ids += seg_ids
        mask += [int(seg.trainable)] * len(seg_ids)
    return Rendered(input_ids=ids, loss_mask=mask)


def generation_header(tokenizer: Tokenizer) -> list[int]:
    """Ids of ``<|im_start|>assistant\\n``: appended to a prompt before generating."""
    return encode_segment(tokenizer, f"{IM_START}assistant\n")


def turn_suffix_ids(tokenizer: Tokenizer) -> list[int]:
    """Ids of the ``\\n`` that follows a generated ``<|im_end|>``."""
    return encode_segment(tokenizer, "\n")


def _segment_ids(tokenizer: Tokenizer, header_role: str, body: str) -> list[int]:
    return [
        tok
        for seg in _message_segments(header_role, body, False)
        for tok in encode_segment(tokenizer, seg.text)
    ]


def observation_ids(tokenizer: Tokenizer, outputs: Sequence[str]) -> list[int]:
    """Ids of the user segment carrying these tool outputs (header, body, separator)."""
    return _segment_ids(tokenizer, "user", tool_responses_text(outputs))


def user_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """Ids of a plain user segment (a user-simulator turn in an interactive dialogue)."""
    return _segment_ids(tokenizer, "user", text)


def im_end_id(tokenizer: Tokenizer) -> int:
    """Id of ``<|im_end|>``; raises when the tokenizer does not have it as one token."""
    ids = encode_segment(tokenizer, IM_END)
    if len(ids) != 1:
        raise ValueError(f"tokenizer encodes {IM_END} as {ids}, not one token")
    return ids[0]
