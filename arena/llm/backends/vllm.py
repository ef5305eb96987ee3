"""The ``vllm`` backend: an in-process vLLM engine (GPU extra).

vLLM is imported in the constructor only, so the rest of Arena never needs it; without it the
constructor says how to get it. The engine starts on the first request (in a worker thread: it
loads weights and may take minutes). Output is guided by the role's JSON schema through vLLM's
structured-output sampling parameters (``StructuredOutputsParams``; ``GuidedDecodingParams`` on
vLLM releases before 0.12).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arena.llm.backends import BackendError, LlmTarget
from arena.llm.core import Completion, CompletionRequest, TransientError, Usage

if TYPE_CHECKING:
    from arena.config import ArenaSettings

INSTALL_HINT = (
    "the vllm backend needs vLLM and a CUDA GPU, and vLLM is not installed: pip install 'arena[gpu]' "
    "(or serve the model with vLLM and use ARENA_LLM=openai://host:port/v1?model=M)"
)


class VllmBackend:
    """``vllm.AsyncLLMEngine`` on a local model folder, with schema-guided JSON output."""

    name = "vllm"

    def __init__(
        self,
        path: str | Path,
        seed: int = 0,
        gpu_memory_utilization: float = 0.85,
        max_model_len: int | None = None,
    ) -> None:
        try:
            import vllm
        except ImportError as exc:
            raise BackendError(INSTALL_HINT) from exc
        self._vllm: Any = vllm
        self.model = str(Path(path).expanduser())
        self.seed = seed
        self.gpu_memory_utilization = gpu_memory_utilization
        self.max_model_len = max_model_len
        self._engine: Any = None
        self._tokenizer: Any = None
        self._start_lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"VllmBackend({self.model!r})"

    def _start(self) -> tuple[Any, Any]:
        from transformers import AutoTokenizer
        from vllm.engine.arg_utils import AsyncEngineArgs

        args = AsyncEngineArgs(
            model=self.model,
            seed=self.seed,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_model_len=self.max_model_len,
        )
        engine = self._vllm.AsyncLLMEngine.from_engine_args(args)
        return engine, AutoTokenizer.from_pretrained(self.model, local_files_only=True)

    async def _ensure_started(self) -> tuple[Any, Any]:
        async with self._start_lock:
            if self._engine is None:
                self._engine, self._tokenizer = await asyncio.to_thread(self._start)
        return self._engine, self._tokenizer

    def sampling_params(self, request: CompletionRequest) -> Any:
        """vLLM ``SamplingParams`` for ``request``, guided by the role's output schema."""
        sampling = request.sampling
        kwargs: dict[str, Any] = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            "seed": sampling.seed + request.attempt,
        }
        if sampling.stop:
            kwargs["stop"] = sampling.stop
        if request.tools is not None:  # an agent turn: free text with tool calls, no JSON guide
            return self._vllm.SamplingParams(**kwargs)
        try:
            from vllm.sampling_params import StructuredOutputsParams

            kwargs["structured_outputs"] = StructuredOutputsParams(json=request.json_schema)
        except ImportError:  # vLLM < 0.12
            from vllm.sampling_params import GuidedDecodingParams

            kwargs["guided_decoding"] = GuidedDecodingParams(json=request.json_schema)
        return self._vllm.SamplingParams(**kwargs)

    async def complete(self, request: CompletionRequest) -> Completion:
        engine, tokenizer = await self._ensure_started()
        prompt = await asyncio.to_thread(
            tokenizer.apply_chat_template,
            request.messages,
            tools=request.tools,  # the template writes them its own way (Hermes <tools> for Qwen)
            tokenize=False,
            add_generation_prompt=True,
        )
        final: Any = None
        async for output in engine.generate(prompt, self.sampling_params(request), uuid.uuid4().hex):
            final = output
        if final is None or not final.outputs:
            raise TransientError("vLLM returned no output")
        choice = final.outputs[0]
        return Completion(
            text=choice.text,
            usage=Usage(
                prompt_tokens=len(final.prompt_token_ids or []), completion_tokens=len(choice.token_ids)
            ),
            finish_reason=getattr(choice, "finish_reason", None),
        )

    async def aclose(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None and hasattr(engine, "shutdown"):
            await asyncio.to_thread(engine.shutdown)


def from_target(target: LlmTarget, settings: ArenaSettings) -> VllmBackend:
    """The ``vllm`` entry point: an in-process engine on a local model folder."""
    assert target.path is not None
    return VllmBackend(target.path, seed=settings.seed)
