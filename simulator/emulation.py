"""Rules synthesiser of ``tool_emulation``: the emulated result of a tool call.

The result comes whole from ``synthesis.sft.emulated_results`` (the tool's response schema, the arguments
and the session's state); the emulator stage runs the same module's ``finish`` on any backend's
answer, so the guarantees (schema-valid, reads see writes) hold whichever backend answered.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from pydantic import BaseModel

from synthesis.sft.emulated_results import Generator
from synthesis.sft.roles.emulation import TOOL_EMULATION, EmulatedResult, EmulationInput


def emulate(inputs: BaseModel, rng: random.Random) -> BaseModel:
    """The rule of ``tool_emulation``: a schema-valid, state-consistent result for the call.

    ``rng`` is not used: randomness is derived from the session variant, tool
    and arguments so that the same call yields the same invented data.
    """
    assert isinstance(inputs, EmulationInput)
    gen = Generator(inputs)
    return EmulatedResult(result=gen.finish(gen.value(gen.schema)))


RULES: dict[str, Callable[[BaseModel, random.Random], BaseModel]] = {TOOL_EMULATION.name: emulate}
