"""A policy served at an OpenAI-compatible endpoint, for ``arena eval --model openai://...``.

The model is reached through the LLM gateway's ``agent_policy`` role, which is sent natively: the
conversation as chat messages with ``tools=``, the reply's ``tool_calls`` parsed (a Hermes
``<tool_call>`` text fallback and a JSON-object fallback live in the gateway). An episode is the
message-level twin of the token-level rollout (``trainer.rollout``)::

    GENERATE --tool calls--------> TOOLS --turns left--> GENERATE
        |                            '--> DONE (max_turns)
        |--no tool call, qa--------> DONE (no_tool_call)
        |--no tool call, interactive-> USER --reply, turns left--> GENERATE
        |                                '--> DONE (user_stop | max_turns)
        '--prompt over the context--> DONE (max_length)

and it ends in the same ``Trajectory`` (no token ids: ``prompt_ids``, ``response_ids``,
``response_mask`` and ``logprobs`` are empty), scored by the environment's reward, so
``trainer.evaluate`` counts successes, F1, turns and tool calls exactly as for a local checkpoint.

Decisions worth knowing:

- Every trial samples anew: the gateway has no response cache, and every turn's ``Sampling`` seed
  derives from the trial seed and the turn number (``derive_seed``), so trials are distinct
  requests and a rerun sends the same requests. Temperature is ``settings.train.temperature`` (the
  one local evaluation uses; capped at 2, the API's maximum); ``top_p`` and ``max_tokens`` are the
  agent role's (``ARENA_LLM_ROLES``), and the context window is ``ARENA_LLM_CONTEXT_TOKENS``.
- A turn whose call raises ``InvalidOutput`` (no usable reply after the gateway's attempts) ends
  the trial with ``TurnFailed``: the evaluation records it as a failed trial, never a crash. A
  conversation that outgrows the context window (``PromptTooLong``) ends the episode with
  ``max_length`` and it is scored, as a local rollout cut by its sequence budget is.
- The endpoint is probed once before anything runs (``GET /models``): an unreachable server, a
  rejected key or an unknown model name is an ``EndpointError`` naming ``--model`` and the fix.
  An outage later on is waited out by the gateway (``arena.llm.outage``), so a server restart does
  not count against the model.
- Tool calls of a turn run one after the other, in order (an interactive environment's state is
  shared between them), as in the token-level rollout.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from arena.llm.backends import make_backend, parse_llm_url
from arena.llm.core import Answer, InvalidOutput, Sampling
from arena.llm.gateway import Gateway, PromptTooLong, backend_health
from arena.llm.roles.agent import AGENT_POLICY, AgentTurn, AgentTurnInput, PlannedCall
from arena.llm.routing import route_of
from arena.records.envs import VerifiedSample
from environments.rewards import ToolResult
from streams.sft.agent_loop import assistant_message
from trainer.rollout import State, Stop, Trajectory, derive_seed

if TYPE_CHECKING:
    from arena.config import ArenaSettings
    from environments.environment import Environment

log = logging.getLogger(__name__)

ENDPOINT_SCHEMES = ("openai://", "openais://")
"""``--model`` values with these prefixes name an endpoint; anything else is a local model folder."""
ENDPOINT_FORM = "openai://host:port/v1?model=NAME (openais:// for https)"
MAX_TEMPERATURE = 2.0
"""The chat API's largest temperature (``Sampling``'s bound)."""


class EndpointError(Exception):
    """The ``--model`` endpoint cannot be evaluated (bad URL, unreachable, rejected); says the fix."""


class TurnFailed(Exception):
    """A turn got no usable reply from the endpoint: the trial ends as a failure."""

    def __init__(self, turn: int, cause: InvalidOutput) -> None:
        self.turn = turn
        self.cause = cause
        super().__init__(f"turn {turn}: {cause}")


def is_endpoint(model: str) -> bool:
    """Whether ``model`` names an OpenAI-compatible endpoint rather than a local folder."""
    return model.strip().startswith(ENDPOINT_SCHEMES)


def check_endpoint_url(url: str) -> None:
    """Raise ``EndpointError`` (naming ``--model`` and the accepted form) unless ``url`` is one."""
    if not is_endpoint(url):
        raise EndpointError(f"--model {url!r} is not an endpoint URL (fix: use {ENDPOINT_FORM})")
    try:
        parse_llm_url(url)
    except ValueError as exc:
        found = re.search(r"is not a valid LLM backend \((.*)\); accepted", str(exc))
        why = found.group(1) if found else str(exc)
        raise EndpointError(
            f"--model {url!r} is not a valid endpoint URL ({why}; fix: use {ENDPOINT_FORM})"
        ) from None


@dataclass
class EndpointPolicy:
    """A model at an endpoint, acting through the gateway's ``agent_policy`` role."""

    gateway: Gateway
    """A gateway on the endpoint alone, without a response cache."""
    url: str
    """The ``--model`` value (it never holds credentials: the key is ``ARENA_LLM_API_KEY``)."""
    temperature: float
    """Sampling temperature of every agent turn."""

    async def turn(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], seed: int
    ) -> Answer[AgentTurn]:
        """The next assistant turn for the conversation so far; raises ``InvalidOutput``."""
        sampling = Sampling(seed=seed, temperature=self.temperature)
        return await self.gateway.call(AGENT_POLICY, AgentTurnInput(messages=messages, tools=tools), sampling)

    async def aclose(self) -> None:
        """Close the gateway (its HTTP client and health tracker)."""
        await self.gateway.aclose()


def endpoint_gateway(settings: ArenaSettings, url: str) -> Gateway:
    """A gateway whose every role goes to ``url``, with the ``llm_*`` settings and no response cache.

    Built like ``Gateway.from_settings`` (routes, attempts, seed, outage waiting), on the endpoint's
    settings (``llm`` = ``url``), but with no cache (evaluation trials must sample anew) and no
    prompt catalog (the agent role's conversation is the sample's own).
    """
    check_endpoint_url(url)
    endpoint_settings = settings.model_copy(update={"llm": url})
    backend = make_backend(endpoint_settings)
    return Gateway(
        backend,
        cache=None,
        catalog=None,
        max_attempts=settings.llm_max_attempts,
        seed=settings.seed,
        health=backend_health(backend),
        routes=lambda role: route_of(endpoint_settings, role),
    )


async def open_endpoint_policy(settings: ArenaSettings, url: str) -> EndpointPolicy:
    """The endpoint policy for ``url``, once a probe found it serving; ``EndpointError`` otherwise."""
    gateway = endpoint_gateway(settings, url)
    probe = getattr(gateway.backend, "probe", None)
    try:
        if probe is not None:
            await probe()
    except Exception as exc:
        await gateway.aclose()
        raise EndpointError(
            f"--model {url}: the endpoint does not serve ({type(exc).__name__}: {exc}) (fix: start the "
            "server, or check host, port, the /v1 path and ?model=; a key goes in ARENA_LLM_API_KEY)"
        ) from None
    temperature = min(settings.train.temperature, MAX_TEMPERATURE)
    if temperature < settings.train.temperature:
        log.warning(
            "train.temperature %s is above the chat API's maximum; sampling at %s",
            settings.train.temperature,
            temperature,
        )
    return EndpointPolicy(gateway=gateway, url=url, temperature=temperature)


@dataclass
class _Episode:
    """The mutable state of one episode."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    turns: int = 0
    tool_calls: int = 0
    failed_calls: int = 0
    user_turns: int = 0
    tool_outputs: list[str] = field(default_factory=list)
    tool_results: list[ToolResult] = field(default_factory=list)
    pending: list[PlannedCall] = field(default_factory=list)
    content: str = ""
    """The latest assistant turn's text (what the user simulator answers)."""
    stop: Stop | None = None

    def done(self, stop: Stop) -> State:
        self.stop = stop
        return State.DONE


class _Driver:
    """One episode's transitions; ``run`` drives them until DONE."""

    def __init__(
        self, policy: EndpointPolicy, env: Environment, sample: VerifiedSample, max_turns: int, seed: int
    ) -> None:
        self.policy = policy
        self.env = env
        self.sample = sample
        self.max_turns = max_turns
        self.seed = seed
        self.ep = _Episode(messages=[dict(m) for m in sample.prompt], tools=list(env.tools))

    async def run(self) -> _Episode:
        state = State.GENERATE
        while state is not State.DONE:
            if state is State.GENERATE:
                state = await self.generate()
            elif state is State.TOOLS:
                state = await self.call_tools()
            else:
                state = await self.user()
        return self.ep

    async def generate(self) -> State:
        """One assistant turn from the endpoint."""
        ep = self.ep
        try:
            answer = await self.policy.turn(ep.messages, ep.tools, derive_seed(self.seed, "turn", ep.turns))
        except PromptTooLong:
            return ep.done("max_length")
        except InvalidOutput as exc:
            raise TurnFailed(ep.turns + 1, exc) from None
        ep.turns += 1
        turn = answer.output
        ep.pending = list(turn.tool_calls)
        ep.content = turn.content
        ep.messages.append(assistant_message(turn.content, ep.pending, ep.turns, answer.reasoning))
        ep.tool_calls += len(ep.pending)
        if ep.pending:
            return State.TOOLS
        if self.sample.kind == "interactive":
            return State.USER
        return ep.done("no_tool_call")

    async def call_tools(self) -> State:
        """Run the turn's calls in order; each result is a ``tool`` message."""
        ep = self.ep
        ids = [str(c["id"]) for c in ep.messages[-1]["tool_calls"]]
        for call_id, call in zip(ids, ep.pending, strict=True):
            obs = await self.env.call(call.name, dict(call.arguments))
            message: dict[str, Any] = {"role": "tool", "tool_call_id": call_id, "content": obs.text}
            message |= ({"name": obs.tool} if obs.tool else {}) | ({} if obs.ok else {"error": True})
            ep.messages.append(message)
            ep.tool_results.append(ToolResult(name=obs.tool, content=obs.text, ok=obs.ok))
            if obs.ok:
                ep.tool_outputs.append(obs.text)
            elif obs.tool:
                ep.failed_calls += 1
        return self._next_turn()

    async def user(self) -> State:
        """Interactive: the simulated user answers the agent's message, or ends the dialogue."""
        ep = self.ep
        if ep.turns >= self.max_turns:
            return ep.done("max_turns")
        reply = await self.env.user_turn(ep.content)
        if reply is None:
            return ep.done("user_stop")
        ep.messages.append({"role": "user", "content": reply})
        ep.user_turns += 1
        return self._next_turn()

    def _next_turn(self) -> State:
        return self.ep.done("max_turns") if self.ep.turns >= self.max_turns else State.GENERATE


async def endpoint_episode(
    policy: EndpointPolicy, env: Environment, sample: VerifiedSample, *, max_turns: int = 32, seed: int = 0
) -> Trajectory:
    """Run ``sample`` in ``env`` (a fresh instance) with the endpoint as the agent, scored by ``env.reward``.

    Raises ``TurnFailed`` when a turn gets no usable reply (the caller records a failed trial).
    """
    if max_turns < 1:
        raise ValueError("max_turns must be at least 1")
    ep = await _Driver(policy, env, sample, max_turns, seed).run()
    assert ep.stop is not None
    trajectory = Trajectory(
        sample_id=sample.sample_id,
        seed=seed,
        messages=ep.messages,
        tools=ep.tools,
        prompt_ids=[],
        response_ids=[],
        response_mask=[],
        logprobs=[],
        turns=ep.turns,
        tool_calls=ep.tool_calls,
        invalid_calls=0,
        failed_calls=ep.failed_calls,
        user_turns=ep.user_turns,
        tool_outputs=ep.tool_outputs,
        tool_results=ep.tool_results,
        stop=ep.stop,
    )
    reward, parts = await env.reward(trajectory)
    return trajectory.model_copy(update={"reward": reward, "reward_parts": parts})
