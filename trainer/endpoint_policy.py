"""A policy served at an OpenAI-compatible endpoint, for ``arena eval --model openai://...``.

The model is reached through the LLM gateway's ``agent_policy`` role, which is sent natively: the
conversation as chat messages with ``tools=``, the reply's ``tool_calls`` parsed (a Hermes
``<tool_call>`` text fallback and a JSON-object fallback live in the gateway). An episode runs the
token-level rollout's state machine (``trainer.turn_loop``), at the message level::

    GENERATE --tool calls--------> TOOLS --turns left--> GENERATE
        |                            '--> DONE (max_turns)
        |--no tool call, qa--------> DONE (no_tool_call)
        |--no tool call, interactive-> USER --reply, turns left--> GENERATE
        |                                '--> DONE (user_stop | max_turns)
        '--prompt over the context--> DONE (max_length)

The endpoint plugs in only its ``Generate`` (one chat call per turn); nothing is counted against a
context budget here (``UNBOUNDED``): the server's window is, through ``PromptTooLong``. It ends in
the same ``Trajectory`` (no token ids: ``prompt_ids``, ``response_ids``, ``response_mask`` and
``logprobs`` are empty), scored by the environment's reward, so ``trainer.evaluate`` counts
successes, F1, turns and tool calls exactly as for a local checkpoint.

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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from arena.llm.backends import make_backend, parse_llm_url
from arena.llm.core import Answer, InvalidOutput, Sampling
from arena.llm.gateway import Gateway, PromptTooLong, backend_health
from arena.llm.roles.agent import AGENT_POLICY, AgentTurn, AgentTurnInput
from arena.llm.routing import route_of
from synthesis.sft.agent_loop import assistant_message
from trainer.rollout import Trajectory, derive_seed, scored, trajectory_of
from trainer.turn_loop import Turn, TurnLoop

if TYPE_CHECKING:
    from arena.config import ArenaSettings
    from arena.records.envs import VerifiedSample
    from environments.environment import Environment
    from trainer.turn_loop import Generate

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


def _endpoint_turns(policy: EndpointPolicy, tools: list[dict[str, Any]], seed: int) -> Generate:
    """The endpoint's side of an episode: one chat call per turn, seeded by the trial seed and the
    turn; ``None`` once the conversation outgrew the context window, ``TurnFailed`` when no usable
    reply came."""

    async def generate(messages: list[dict[str, Any]], turn: int) -> Turn | None:
        try:
            answer = await policy.turn(messages, tools, derive_seed(seed, "turn", turn - 1))
        except PromptTooLong:
            return None
        except InvalidOutput as exc:
            raise TurnFailed(turn, exc) from None
        reply = answer.output
        calls = list(reply.tool_calls)
        message = assistant_message(reply.content, calls, turn, answer.reasoning)
        return Turn(message=message, content=reply.content, calls=calls)

    return generate


async def endpoint_episode(
    policy: EndpointPolicy, env: Environment, sample: VerifiedSample, *, max_turns: int = 32, seed: int = 0
) -> Trajectory:
    """Run ``sample`` in ``env`` (a fresh instance) with the endpoint as the agent, scored by ``env.reward``.

    Raises ``TurnFailed`` when a turn gets no usable reply (the caller records a failed trial).
    """
    if max_turns < 1:
        raise ValueError("max_turns must be at least 1")
    # The environment's own list: one that offers more tools mid-episode (BFCL's held-out functions)
    # extends it in place, and the next turn sends them.
    generate = _endpoint_turns(policy, env.tools, seed)
    episode = await TurnLoop(env=env, sample=sample, max_turns=max_turns, generate=generate).run()
    trajectory = trajectory_of(episode, sample_id=sample.sample_id, seed=seed, tools=list(env.tools))
    return await scored(env, trajectory)
