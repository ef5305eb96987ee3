"""Arena's one configuration model.

Values come from, in order of precedence: keyword arguments, ``ARENA_*``
environment variables, an optional TOML file (``ARENA_CONFIG`` or
``./arena.toml``), then the defaults below. Secrets are ``SecretStr`` so they
never show up in ``repr``, logs or ``arena status``.
"""

from __future__ import annotations

import difflib
import json
import os
import typing
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlparse

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)


def _default_home() -> Path:
    return Path.home() / ".arena"


def _toml_path() -> Path:
    raw = os.environ.get("ARENA_CONFIG")
    if raw is None:
        return Path("arena.toml")
    if not raw.strip():
        raise settings_error(
            "ARENA_CONFIG",
            raw,
            "ARENA_CONFIG is set but empty (fix: unset it to read ./arena.toml, or name a TOML file)",
        )
    path = Path(raw).expanduser()
    if path.is_dir():
        raise settings_error(
            "ARENA_CONFIG",
            raw,
            f"ARENA_CONFIG={raw} is a folder, not a settings file (fix: name a TOML file)",
        )
    return path


class Section(BaseModel):
    """A group of settings (``[sft]`` in the TOML file, ``ARENA_SFT__<FIELD>`` in the environment).

    Frozen like every settings model: change a copy with ``model_copy(update=...)``. An unknown
    key is an error, not silently ignored.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")


class SandboxSettings(Section):
    """Limits of the sandbox that runs generated code; env vars ``ARENA_SANDBOX__<FIELD>``."""

    pool_size: Annotated[
        int,
        Field(
            default=16,
            ge=1,
            le=256,
            description="Sandbox sessions open at once per process (an environment instance holds one for its "
            "episode; a one-off run holds one while it runs); more wait. Each gets its own uid.",
        ),
    ]
    timeout_s: Annotated[
        float, Field(default=5.0, gt=0, le=600, description="Wall-clock limit per execution (seconds).")
    ]
    memory_mb: Annotated[
        int, Field(default=512, ge=32, le=65536, description="Address-space cap per execution (MiB).")
    ]
    max_procs: Annotated[
        int, Field(default=16, ge=1, le=4096, description="Processes the sandbox uid may run at once.")
    ]
    session_cpu_s: Annotated[
        float,
        Field(
            default=600.0,
            gt=0,
            le=86400,
            description="CPU seconds one session (an episode, all its calls) may use before it is killed.",
        ),
    ]
    max_output_bytes: Annotated[
        int, Field(default=65536, ge=1024, le=16 << 20, description="Captured stdout/stderr cap (bytes).")
    ]
    uid_base: Annotated[
        int,
        Field(
            default=61000,
            ge=1000,
            le=2**31 - 70000,
            description="First of the unprivileged uids given to sandbox slots (one uid per slot).",
        ),
    ]


class EnvSettings(Section):
    """Knobs of the environment track (ASTRA §2.2); env vars ``ARENA_ENVS__<FIELD>``."""

    qs_threshold: Annotated[
        float,
        Field(
            default=0.8,
            ge=0,
            le=1,
            description="Keep QA instances with QS >= this (eq. 21); above 0.75 so one failed "
            "dimension (e.g. TC = 0) drops the instance.",
        ),
    ]
    synthesis_attempts: Annotated[
        int,
        Field(
            default=3, ge=1, le=20, description="Attempts per sub-environment, restarting at the invocation."
        ),
    ]
    extra_params: Annotated[
        int, Field(default=2, ge=0, le=8, description="Parameters added by complexity scaling per tool.")
    ]
    heldout_k: Annotated[
        int, Field(default=10, ge=2, le=1000, description="Split modulus k: env hash mod k == 0 is held out.")
    ]
    heldout_families_k: Annotated[
        int,
        Field(
            default=0,
            ge=0,
            le=1000,
            description="Tool-family split modulus: a family (tool name without its _2, _3 suffix) whose "
            "hash mod k == 0 is held out with every package calling it, so evaluation covers tools never "
            "trained on; 0 holds out none, 1 is refused (it would hold out everything).",
        ),
    ]
    heldout_families: Annotated[
        list[str],
        Field(
            default_factory=list,
            description="Tool families held out by name, besides heldout_families_k, as JSON: "
            '["get_order_status"] holds out get_order_status, get_order_status_2, ... and every package '
            "calling one.",
        ),
    ]
    flaw_rate: Annotated[
        float,
        Field(
            default=0.15,
            ge=0,
            le=1,
            description="rules backend: share of QA drafts made with a realistic flaw, so the gates have "
            "something to catch (an LLM makes these mistakes on its own).",
        ),
    ]
    demo_instances: Annotated[
        int, Field(default=8, ge=1, le=1000, description="Instances per built-in knowledge base in the demo.")
    ]

    @field_validator("heldout_families_k")
    @classmethod
    def _not_every_family(cls, k: int) -> int:
        if k == 1:
            raise ValueError("1 would hold out every tool family; use 0 for none, or 2 and above")
        return k


class EigenSettings(Section):
    """Knobs of the EigenData track (seed paper 003, §4); env vars ``ARENA_EIGEN__<FIELD>``."""

    prompt_sets: Annotated[
        int, Field(default=2, ge=1, le=16, description="K: diverse prompt sets written in phase 1 (§4.4).")
    ]
    pilot_iterations: Annotated[
        int, Field(default=16, ge=1, le=16, description="Most phase-2 pilot iterations per prompt set.")
    ]
    pilot_batch: Annotated[
        int, Field(default=8, ge=1, le=256, description="Tasks drawn per pilot iteration (small batches).")
    ]
    max_infeasibility: Annotated[
        float, Field(default=0.2, ge=0, le=1, description="Pilot converges once INFEASIBLE share <= this.")
    ]
    min_validity: Annotated[
        float, Field(default=0.9, ge=0, le=1, description="... and tool-call validity >= this.")
    ]
    max_quality_change: Annotated[
        float, Field(default=0.25, ge=0, le=1, description="... and quality moved at most this per batch.")
    ]
    evolve: Annotated[
        bool,
        Field(default=True, description="Judge critiques update parameters and prompts (off: ablation)."),
    ]
    instances: Annotated[
        int, Field(default=6, ge=1, le=100_000, description="Seeds `arena publish domain` sends to phase 3.")
    ]
    db_size: Annotated[
        Literal["small", "medium", "large"],
        Field(default="small", description="Size of each instance's seeded database (generator.py)."),
    ]
    max_repair_rounds: Annotated[
        int, Field(default=3, ge=0, le=3, description="Validate <-> modify rounds before a rejection (§4.2).")
    ]
    max_turns: Annotated[int, Field(default=12, ge=1, le=64, description="User replies per dialogue.")]
    audit_batch: Annotated[
        int, Field(default=4, ge=1, le=1000, description="Phase-3 audit: items per audit point.")
    ]
    audit_window: Annotated[
        int, Field(default=3, ge=1, le=100, description="Audit points compared: first w vs last w.")
    ]


class UserSimSettings(Section):
    """The simulated user's behaviours (EigenData §4.2), as rates; env vars ``ARENA_USER_SIM__<FIELD>``.

    They apply wherever the simulated user plays: dialogue synthesis, interactive RL rollouts and
    evaluation. Each draw is seeded (``seed``, the scenario, the request or tool), so a dialogue
    replays identically. All 0 (the default): the user states every detail, never changes its
    mind and enters every value right -- the behaviour accepted dialogues were measured with.
    """

    incomplete_info: Annotated[
        float,
        Field(
            default=0.0,
            ge=0,
            le=1,
            description="Chance that a request (and the opening's email) is stated without its identifiers "
            "(ids, emails); the user gives them when the agent asks.",
        ),
    ]
    goal_change: Annotated[
        float,
        Field(
            default=0.0,
            ge=0,
            le=1,
            description="Chance that a request is first stated with one number different, then changed on "
            "the user's next reply ('Sorry, I changed my mind: ...').",
        ),
    ]
    mistakes: Annotated[
        float,
        Field(
            default=0.0,
            ge=0,
            le=1,
            description="Chance that the user's first try of an in-app action mistypes a digit of a value "
            "it enters; it reports the app's error and enters the right value when asked again.",
        ),
    ]
    seed: Annotated[int, Field(default=0, ge=0, description="Seed of the behaviour draws.")]


class SftSettings(Section):
    """Knobs of the SFT track (ASTRA §2.1); env vars ``ARENA_SFT__<FIELD>``."""

    chain_syntheses: Annotated[
        int, Field(default=6, ge=1, le=200, description="Joint (task, chain) syntheses per server (§2.1.2).")
    ]
    walks: Annotated[
        int,
        Field(default=6, ge=1, le=500, description="Random walks sampled per server as candidate chains."),
    ]
    min_chain_length: Annotated[
        int, Field(default=2, ge=1, le=16, description="Shortest candidate chain kept (tools).")
    ]
    max_chain_length: Annotated[
        int, Field(default=4, ge=1, le=16, description="Longest random walk (tools).")
    ]
    acyclic_walks: Annotated[
        bool,
        Field(
            default=False,
            description="Walks never revisit a tool when true; when false, pointless repeats are "
            "left to the task-chain coherence check.",
        ),
    ]
    server_tasks: Annotated[
        int, Field(default=2, ge=0, le=100, description="Server-only tasks generated per server (§2.1.3).")
    ]
    augment_axes: Annotated[
        list[Literal["diversity", "complexity", "persona"]],
        Field(
            default_factory=lambda: ["diversity", "complexity", "persona"],
            description="Augmentation axes applied to every original task.",
        ),
    ]
    theta_question_quality: Annotated[
        float, Field(default=0.6, ge=0, le=1, description="Threshold on question quality S_qq (eq. 1).")
    ]
    theta_scenario_realism: Annotated[
        float, Field(default=0.6, ge=0, le=1, description="Threshold on scenario realism S_sr (eq. 1).")
    ]
    theta_tool_necessity: Annotated[
        float, Field(default=0.6, ge=0, le=1, description="Threshold on tool-use necessity S_tn (eq. 1).")
    ]
    emulator_failure_rate: Annotated[
        float,
        Field(
            default=0.2, ge=0, le=1, description="Probability an emulated call fails (timeout, unreachable)."
        ),
    ]
    max_turns: Annotated[
        int, Field(default=8, ge=1, le=64, description="Assistant turns before the agent loop stops.")
    ]
    tool_timeout_s: Annotated[
        float, Field(default=20.0, gt=0, le=600, description="Timeout of one real MCP tool call.")
    ]
    reward_threshold: Annotated[
        float,
        Field(
            default=0.75, ge=0, le=1, description="Overall 7-dim reward a trajectory needs for samples.sft."
        ),
    ]

    @model_validator(mode="after")
    def _lengths(self) -> SftSettings:
        if self.min_chain_length > self.max_chain_length:
            raise ValueError("sft.min_chain_length must not exceed sft.max_chain_length")
        return self


class TrainSettings(Section):
    """Knobs of the training service (ASTRA §3, EigenData §5); env vars ``ARENA_TRAIN__<FIELD>``."""

    run: Annotated[
        str,
        Field(
            default="default",
            pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
            description="Run name: checkpoints live under trainer/<run>/ in the lake; restarts resume it.",
        ),
    ]
    model: Annotated[
        str | None,
        Field(
            default=None,
            description="Base model: a local Hugging Face folder, a .gguf file or a bundled model (smollm2; "
            "the local-llm extra), converted once under $ARENA_HOME/models; `--tiny` builds one.",
        ),
    ]
    backend: Annotated[
        Literal["hf", "vllm"],
        Field(default="hf", description="Rollout backend: transformers generate (CPU) or vLLM (GPU extra)."),
    ]
    vllm_gpu_memory: Annotated[
        float,
        Field(
            default=0.5,
            gt=0,
            lt=1,
            description="backend vllm: share of the GPU's memory the rollout engine takes (weights plus KV "
            "cache); the rest stays for the trained policy, its gradients and optimizer state on the same GPU.",
        ),
    ]
    vllm_engine_args: Annotated[
        dict[str, Any],
        Field(
            default_factory=dict,
            description='backend vllm: further keyword arguments of vllm.LLM (e.g. {"enforce_eager": true, '
            '"attention_backend": "TRITON_ATTN"}); they win over the dtype and memory share Arena sets.',
        ),
    ]
    device: Annotated[
        Literal["auto", "cpu", "cuda"],
        Field(
            default="auto",
            description="Where the policy trains and the hf backend generates; auto: the GPU when torch sees "
            "one, else the CPU.",
        ),
    ]
    precision: Annotated[
        Literal["auto", "fp32", "bf16"],
        Field(
            default="auto",
            description="Forward passes (generation, log-probs, losses) in bf16 autocast, weights and "
            "optimizer state fp32; auto: bf16 on a GPU that supports it, else fp32.",
        ),
    ]
    group_id: Annotated[
        str, Field(default="arena-trainer", description="Consumer group the trainer commits offsets under.")
    ]
    # --- SFT (ASTRA §3.1 cold start) ---
    sft_steps: Annotated[
        int,
        Field(
            default=50,
            ge=0,
            le=1_000_000,
            description="SFT steps on samples.sft before GRPO (fewer if the topic runs dry first).",
        ),
    ]
    sft_batch: Annotated[int, Field(default=8, ge=1, le=4096, description="Conversations per SFT step.")]
    sft_lr: Annotated[float, Field(default=1e-5, gt=0, le=1, description="Peak SFT learning rate (cosine).")]
    warmup_ratio: Annotated[
        float, Field(default=0.05, ge=0, lt=1, description="Share of SFT steps with linear warmup.")
    ]
    # --- GRPO (ASTRA §3.2, eq. 23/32; EigenData §5) ---
    lr: Annotated[float, Field(default=1e-6, ge=0, le=1, description="GRPO learning rate (constant).")]
    group_size: Annotated[
        int, Field(default=4, ge=2, le=256, description="G: trajectories rolled out per prompt.")
    ]
    batch_groups: Annotated[
        int, Field(default=4, ge=1, le=4096, description="n: valid groups every GRPO step trains on.")
    ]
    delta: Annotated[
        float,
        Field(
            default=0.0,
            ge=-1,
            le=1,
            description="A group is valid when Std(R) > delta (0: EigenData's dynamic filtering; "
            "negative: keep every group, an ablation).",
        ),
    ]
    final_short_batch: Annotated[
        bool,
        Field(
            default=False,
            description="With --until-drained or --steps: when the topic runs dry with fewer than n valid "
            "groups, train them as a final short step (reported as short). Off: they are not trained (no "
            "step), and are rolled out again when the run resumes on more samples. Every other step holds "
            "exactly n valid groups (ASTRA §3.1 adaptive batch filling keeps drawing until it does).",
        ),
    ]
    clip_low: Annotated[float, Field(default=0.2, ge=0, le=1, description="PPO clip epsilon below 1.")]
    clip_high: Annotated[
        float, Field(default=0.2, ge=0, le=10, description="PPO clip epsilon above 1 (clip-higher).")
    ]
    loss_agg: Annotated[
        Literal["token-mean", "group-token-mean", "seq-mean-token-mean"],
        Field(
            default="token-mean",
            description="Loss aggregation: batch-level token-mean, per-group token-mean (eq. 32), "
            "or seq-mean-token-mean.",
        ),
    ]
    adv_std: Annotated[
        Literal["unbiased", "biased", "none"],
        Field(default="unbiased", description="Std in (R - mean)/(std + 1e-6); unbiased as verl."),
    ]
    mini_batches: Annotated[
        int,
        Field(
            default=1,
            ge=1,
            le=64,
            description="Optimizer steps per GRPO batch (its groups split evenly); 1 = batch is the "
            "mini-batch, strictly on-policy.",
        ),
    ]
    update_epochs: Annotated[
        int,
        Field(
            default=1,
            ge=1,
            le=16,
            description="mu: passes over each GRPO batch (GRPO's iterations per sample batch; TRL "
            "num_iterations, verl ppo_epochs). Every pass after the first is off-policy by the earlier "
            "optimizer steps, which the clipped ratio against the rollout's log-probs bounds.",
        ),
    ]
    max_off_policy_steps: Annotated[
        int,
        Field(
            default=0,
            ge=0,
            le=8,
            description="s: rollouts for step t use the weights of step t-1-s, so the next batch rolls out "
            "while the current update runs (trainer.rollout_weights). 0 = strictly on-policy, no overlap "
            "(ASTRA); > 0 adds the truncated importance-sampling correction (is_cap) and a rollout copy "
            "of the weights plus up to s host-memory snapshots.",
        ),
    ]
    is_cap: Annotated[
        float,
        Field(
            default=2.0,
            ge=1,
            le=100,
            description="With max_off_policy_steps > 0: cap C of the per-token importance weight "
            "pi_prox / pi_behaviour (truncated IS, as verl's rollout correction).",
        ),
    ]
    micro_batch: Annotated[
        int, Field(default=4, ge=1, le=4096, description="Sequences per forward/backward pass.")
    ]
    max_grad_norm: Annotated[float, Field(default=1.0, gt=0, description="Gradient clipping norm.")]
    reward: Annotated[
        Literal["f1", "recall", "precision"],
        Field(default="f1", description="QA reward: F1 (eq. 31), or recall-/precision-only for ablation."),
    ]
    mixing: Annotated[
        Literal["bands", "none", "random"],
        Field(default="bands", description="Irrelevant-tool mixing (§3.2.2) or an ablation."),
    ]
    k_per_band: Annotated[
        int, Field(default=2, ge=0, le=64, description="K: most mixed-in tools per similarity band.")
    ]
    # --- rollouts (§3.1) ---
    max_turns: Annotated[int, Field(default=32, ge=1, le=256, description="Assistant turns per rollout.")]
    max_seq_len: Annotated[
        int, Field(default=4096, ge=64, le=1 << 20, description="Longest rollout (prompt + response tokens).")
    ]
    max_new_tokens: Annotated[
        int, Field(default=256, ge=1, le=1 << 16, description="Most tokens one assistant turn generates.")
    ]
    temperature: Annotated[float, Field(default=1.0, gt=0, le=5, description="Rollout sampling temperature.")]
    user_simulator: Annotated[
        Literal["auto", "gateway", "policy"],
        Field(
            default="auto",
            description="Who plays the user in interactive GRPO rollouts (EigenData §5): 'policy' = a frozen "
            "copy of the policy as it was at the end of SFT (the SFT-tuned user simulator); 'gateway' = the "
            "LLM gateway's user_simulator role (ARENA_LLM; rules by default); 'auto' = policy when the SFT "
            "phase trained on at least one role_target='user' sample, else gateway. Fixed when GRPO starts "
            "and kept on resume.",
        ),
    ]
    # --- checkpoints ---
    weights_every: Annotated[
        int, Field(default=10, ge=1, le=1_000_000, description="Save model weights every N steps.")
    ]
    state_every: Annotated[
        int,
        Field(
            default=5,
            ge=1,
            le=1_000_000,
            description="Save the full training state (weights, optimizer, scheduler, RNG, batch buffer, "
            "consumer offsets) every N steps.",
        ),
    ]
    keep_states: Annotated[
        int, Field(default=2, ge=1, le=2, description="Full training states kept (the last 1-2).")
    ]

    @field_validator("model", mode="before")
    @classmethod
    def _model_not_empty(cls, v: Any) -> Any:
        return not_empty(v, "train__model")


class MetricsSettings(Section):
    """Prometheus endpoint of `arena worker` and `arena train`; env vars ``ARENA_METRICS__<FIELD>``."""

    port: Annotated[
        int, Field(default=0, ge=0, le=65535, description="Port serving /metrics; 0: no endpoint.")
    ]
    host: Annotated[
        str,
        Field(
            default="127.0.0.1",
            min_length=1,
            description="Address it binds; 0.0.0.0 lets other hosts scrape.",
        ),
    ]
    lag_cache_s: Annotated[
        float,
        Field(
            default=2.0,
            ge=0,
            le=60,
            description="Scrapes within this many seconds reuse the last lag figures.",
        ),
    ]


RoleKind = Literal["generator", "judge", "emulator", "agent", "user"]
"""What a role does, which sets its default sampling: judges and emulators are deterministic."""

ROLE_KINDS: tuple[str, ...] = ("generator", "judge", "emulator", "agent", "user")


class RoleSettings(Section):
    """Generation settings and endpoint of a role, or of every role of a kind (``llm_roles``).

    Every field is optional: an unset one falls back to the kind's entry, then to the kind's
    default (``arena.llm.routing.KIND_DEFAULTS``), then to the endpoint settings.
    """

    temperature: Annotated[float | None, Field(default=None, ge=0, le=2, description="Sampling temperature.")]
    top_p: Annotated[float | None, Field(default=None, gt=0, le=1, description="Nucleus sampling mass.")]
    max_tokens: Annotated[
        int | None, Field(default=None, ge=1, le=131072, description="Most tokens one reply may generate.")
    ]
    stop: Annotated[
        list[str] | None, Field(default=None, max_length=8, description="Stop sequences (at most 8).")
    ]
    seed: Annotated[
        int | None, Field(default=None, ge=0, description="Sampling seed (servers that take one).")
    ]
    llm: Annotated[
        str | None,
        Field(
            default=None,
            description="Endpoint of this role (same forms as ARENA_LLM), e.g. a larger judge model.",
        ),
    ]
    context_tokens: Annotated[
        int | None,
        Field(
            default=None,
            ge=512,
            le=10_000_000,
            description="Context window of this role's endpoint (its max_model_len), when it is not the default's.",
        ),
    ]


_NOT_EMPTY = ("home", "broker", "lake_url", "s3_endpoint", "s3_region", "lancedb_uri", "catalog_url", "llm")
"""Settings for which an empty value is a mistake (unset them for the default), never "unset"."""


class ArenaSettings(BaseSettings):
    """Everything a worker, the CLI or a test needs to find the stack."""

    model_config = SettingsConfigDict(
        env_prefix="ARENA_", env_nested_delimiter="__", extra="forbid", validate_default=True, frozen=True
    )

    home: Annotated[
        Path,
        Field(
            default_factory=_default_home,
            description="State folder of the embedded stack: broker data, lake, LanceDB, catalog, logs.",
        ),
    ]
    broker: Annotated[
        str | None,
        Field(
            default=None,
            description="Kafka bootstrap servers (host:port[,host:port]). Unset: use the embedded broker.",
        ),
    ]
    lake_url: Annotated[
        str | None,
        Field(
            default=None,
            description="Artifact lake: file:///path or s3://bucket/prefix. Unset: file://$ARENA_HOME/lake.",
        ),
    ]
    s3_endpoint: Annotated[
        str | None,
        Field(
            default=None,
            description="S3/MinIO endpoint URL, e.g. http://127.0.0.1:9000 (used by s3:// lake and LanceDB URIs).",
        ),
    ]
    s3_access_key: Annotated[SecretStr | None, Field(default=None, description="S3 access key id.")]
    s3_secret_key: Annotated[SecretStr | None, Field(default=None, description="S3 secret access key.")]
    s3_region: Annotated[str, Field(default="us-east-1", description="S3 region name.")]
    lancedb_uri: Annotated[
        str | None,
        Field(
            default=None,
            description="LanceDB URI: a folder or s3://bucket/prefix. Unset: $ARENA_HOME/lancedb.",
        ),
    ]
    catalog_url: Annotated[
        SecretStr | None,
        Field(
            default=None,
            description="SQLAlchemy URL of the catalog (sqlite:///... or postgresql://...). "
            "Secret because Postgres URLs carry passwords. Unset: sqlite:///$ARENA_HOME/catalog.db.",
        ),
    ]
    demo_mcp_port: Annotated[
        int,
        Field(
            default=0,
            ge=0,
            le=65535,
            description="Loopback port of the MCP server `arena demo` deploys (0: a free one). Its URL is "
            "part of the server's record, so runs that must match record for record pin it (the server "
            "keeps serving until `arena down`, so a later demo or replay on the same home reuses it).",
        ),
    ]
    demo_mcp_clock: Annotated[
        datetime | None,
        Field(
            default=datetime(2026, 1, 5, 9, 0, tzinfo=UTC),
            description="Start of a logical clock (ISO 8601) for the demo's notes MCP server: each reading "
            "advances it 1 s, so its tool results repeat from run to run (a replay reproduces them). "
            "None (in arena.toml or code): wall time.",
        ),
    ]
    llm: Annotated[
        str,
        Field(
            default="rules",
            description="LLM backend: rules | openai://host:port/v1?model=M | hf:///path | vllm:///path | "
            "NAME://... (the backend an installed package registers as NAME under the arena.llm_backends "
            "entry points).",
        ),
    ]
    llm_concurrency: Annotated[
        int,
        Field(
            default=64,
            ge=1,
            le=1024,
            description="Most LLM requests in flight per endpoint, shared by every stage process "
            "(the admission coordinator enforces it across processes)",
        ),
    ]
    llm_timeout_s: Annotated[
        float, Field(default=60.0, gt=0, le=3600, description="Timeout of one LLM request.")
    ]
    llm_learn_capacity: Annotated[
        bool,
        Field(
            default=True,
            description="Learn how many requests each openai:// endpoint really serves at once from "
            "their latency (at most llm_concurrency; arena.llm.capacity), so a one-slot server is not "
            "sent a queue that runs into the timeout; false: always llm_concurrency",
        ),
    ]
    llm_max_attempts: Annotated[
        int,
        Field(
            default=3,
            ge=1,
            le=20,
            description="Attempts per LLM call (transport errors and invalid output) before giving up.",
        ),
    ]
    llm_api_key: Annotated[
        SecretStr | None, Field(default=None, description="Bearer token for an OpenAI-compatible server.")
    ]
    llm_context_tokens: Annotated[
        int,
        Field(
            default=32768,
            ge=512,
            le=10_000_000,
            description="Context window of the LLM endpoint in tokens (vLLM's max_model_len): prompt plus "
            "reply never exceed it; stages that embed knowledge retrieve what fits and record what they cut",
        ),
    ]
    llm_roles: Annotated[
        dict[str, RoleSettings],
        Field(
            default_factory=dict,
            description="Per-role (or per-kind: generator, judge, emulator, agent, user) generation settings "
            'and endpoints, as JSON: {"judge": {"llm": "openai://...", "temperature": 0}, '
            '"chain_synthesis": {"max_tokens": 2048}}',
        ),
    ]
    llm_prompt_files: Annotated[
        dict[str, Path],
        Field(
            default_factory=dict,
            description='Prompt overrides per role, as JSON: {"augment_task": "prompts/augment.txt"}. '
            "A file holds the role's system prompt, a line '---', then its user template (with "
            "{input}); without the '---' line it replaces the system prompt only. `arena llm prompt "
            "ROLE` prints a role's current text to start from.",
        ),
    ]
    seed: Annotated[int, Field(default=0, ge=0, description="Global seed for every random choice.")]
    sft: Annotated[
        SftSettings, Field(default_factory=SftSettings, description="SFT-track knobs (ASTRA §2.1).")
    ]
    envs: Annotated[
        EnvSettings,
        Field(default_factory=EnvSettings, description="Environment-track knobs (ASTRA §2.2)."),
    ]
    eigen: Annotated[
        EigenSettings,
        Field(default_factory=EigenSettings, description="EigenData-track knobs (seed paper 003)."),
    ]
    train: Annotated[
        TrainSettings, Field(default_factory=TrainSettings, description="Training-service knobs.")
    ]
    user_sim: Annotated[
        UserSimSettings,
        Field(
            default_factory=UserSimSettings,
            description="Simulated-user behaviour rates (synthesis, RL rollouts, evaluation).",
        ),
    ]
    sandbox: Annotated[
        SandboxSettings,
        Field(default_factory=SandboxSettings, description="Sandbox limits for generated code."),
    ]
    metrics: Annotated[
        MetricsSettings,
        Field(
            default_factory=MetricsSettings,
            description="Prometheus /metrics endpoint of workers and trainer.",
        ),
    ]
    worker_fork: Annotated[
        bool,
        Field(
            default=True,
            description="`arena worker` forks its stage processes from one process that imported the "
            "stage code once (saves each 2-5 CPU-seconds); false: each one runs `python -m app.run`.",
        ),
    ]
    commit_interval_s: Annotated[
        float,
        Field(
            default=0.5,
            gt=0,
            le=60,
            description="How often stage workers commit transactions (offsets + outputs).",
        ),
    ]
    stage_concurrency: Annotated[
        int,
        Field(
            default=32,
            ge=1,
            le=4096,
            description="Input records one stage worker handles at once (outputs and offsets still "
            "commit in offset order). Per stage: ARENA_STAGE_CONCURRENCY_BY_STAGE.",
        ),
    ]
    stage_concurrency_by_stage: Annotated[
        dict[str, Annotated[int, Field(ge=1, le=4096)]],
        Field(
            default_factory=dict,
            description='Per-stage override of stage_concurrency, as JSON: {"trajectories": 64, "chains": 8}.',
        ),
    ]
    sink_batch_size: Annotated[
        int,
        Field(
            default=500,
            ge=1,
            le=100_000,
            description="Records per Parquet file the lake sink writes at most.",
        ),
    ]
    sink_flush_s: Annotated[
        float,
        Field(
            default=1.0,
            gt=0,
            le=600,
            description="Longest time the lake sink holds a partial batch before writing it.",
        ),
    ]
    max_description_bytes: Annotated[
        int,
        Field(
            default=8192,
            ge=64,
            description="Tool descriptions longer than this (UTF-8 bytes) are capped.",
        ),
    ]
    claim_threshold_bytes: Annotated[
        int,
        Field(
            default=512 * 1024,
            ge=1024,
            le=900 * 1024,
            description="Record values longer than this (bytes) are written once to the lake "
            "(claims/<sha256>) and travel as a small reference (claim check), so no record reaches "
            "the broker's message limit (1 MiB by default).",
        ),
    ]

    @field_validator(*_NOT_EMPTY, mode="before")
    @classmethod
    def _not_empty(cls, v: Any, info: ValidationInfo) -> Any:
        return not_empty(v, info.field_name or "")

    @field_validator("home", mode="after")
    @classmethod
    def _absolute_home(cls, v: Path) -> Path:
        home = v.expanduser().resolve()
        if home.exists() and not home.is_dir():
            raise ValueError(
                f"ARENA_HOME={v} is not a folder (fix: point ARENA_HOME at a folder; it is created if missing)"
            )
        if home.is_dir() and not os.access(home, os.W_OK | os.X_OK):
            raise ValueError(
                f"ARENA_HOME={v} is not writable (fix: point ARENA_HOME at a folder you can write)"
            )
        return home

    @field_validator("lake_url")
    @classmethod
    def _check_lake_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        scheme = urlparse(v).scheme
        if scheme not in ("file", "s3"):
            raise ValueError(f"ARENA_LAKE_URL must start with file:// or s3://, got {v!r}")
        if scheme == "s3" and not urlparse(v).netloc:
            raise ValueError("ARENA_LAKE_URL s3:// needs a bucket: s3://bucket/prefix")
        if scheme == "file" and not (urlparse(v).netloc + urlparse(v).path).strip("/"):
            raise ValueError(f"ARENA_LAKE_URL={v!r} names no folder (fix: file:///absolute/path)")
        return v

    @field_validator("llm_roles")
    @classmethod
    def _known_roles(cls, v: dict[str, RoleSettings]) -> dict[str, RoleSettings]:
        if not v:
            return v  # nothing to check: finding the roles imports every track's role modules (0.5 s)
        # Imported here: finding the roles imports the tracks' role modules, which read settings.
        from arena.llm.roles.registry import roles

        known = roles()
        unknown = sorted(k for k in v if k not in known and k not in ROLE_KINDS)
        if unknown:
            raise ValueError(
                f"ARENA_LLM_ROLES names no role or kind {unknown}; kinds: {', '.join(ROLE_KINDS)}; "
                f"roles: {', '.join(sorted(known))}"
            )
        return v

    @model_validator(mode="after")
    def _s3_needs_endpoint(self) -> ArenaSettings:
        uses_s3 = any((u or "").startswith("s3://") for u in (self.lake_url, self.lancedb_uri))
        if uses_s3 and not self.s3_endpoint:
            raise ValueError(
                "an s3:// lake or LanceDB URI needs ARENA_S3_ENDPOINT (e.g. http://127.0.0.1:9000)"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml = StrictTomlSource(settings_cls, toml_file=_toml_path())
        return (init_settings, EnvCheck(settings_cls), env_settings, toml, file_secret_settings)

    def concurrency_of(self, stage: str) -> int:
        """Records ``stage`` handles at once: its override, else ``stage_concurrency``."""
        return self.stage_concurrency_by_stage.get(stage, self.stage_concurrency)

    # Derived locations -------------------------------------------------
    @property
    def lake(self) -> str:
        return self.lake_url or f"file://{self.home / 'lake'}"

    @property
    def lancedb(self) -> str:
        return self.lancedb_uri or str(self.home / "lancedb")

    @property
    def catalog(self) -> str:
        if self.catalog_url is not None:
            return self.catalog_url.get_secret_value()
        return f"sqlite:///{self.home / 'catalog.db'}"

    def s3_credentials(self) -> dict[str, str]:
        """Plain-text S3 credentials for clients; never log the result."""
        return {
            "endpoint": self.s3_endpoint or "",
            "access_key": self.s3_access_key.get_secret_value() if self.s3_access_key else "",
            "secret_key": self.s3_secret_key.get_secret_value() if self.s3_secret_key else "",
            "region": self.s3_region,
        }

    def public_view(self) -> dict[str, Any]:
        """What `arena status` may print: secrets masked, URLs without passwords."""
        return {
            "home": str(self.home),
            "broker": self.broker or "(embedded)",
            "lake": self.lake,
            "s3_endpoint": self.s3_endpoint,
            "s3_access_key": "***" if self.s3_access_key else None,
            "lancedb": self.lancedb,
            "catalog": redact_url(self.catalog),
            "llm": self.llm,
        }


def redact_url(url: str) -> str:
    """Replace the password part of a URL with ***."""
    parsed = urlparse(url)
    if parsed.password:
        netloc = parsed.netloc.replace(f":{parsed.password}@", ":***@")
        return parsed._replace(netloc=netloc).geturl()
    return url


# Strictness: empty values, unknown keys ----------------------------------------------
NOT_SETTINGS_ENV: frozenset[str] = frozenset(
    {
        "ARENA_CONFIG",  # the settings file itself, read before the settings (_toml_path)
        "ARENA_LOG_LEVEL",  # app/run.py: log level of a worker process
        "ARENA_SUPERVISED",  # app/worker.py -> app/run.py: the worker runs under `arena worker`
        "ARENA_WORKER_INSTANCE",  # app/worker.py -> app/run.py: static group-member id of a worker
        "ARENA_WORKER_SLOT",  # app/worker.py: which `arena worker` on a host (part of the member id)
        "ARENA_LLM_SERVE_API_KEY",  # app/cli_llm.py: `arena llm serve --api-key` (a typer envvar)
        "ARENA_VERL_PYTHON",  # tests/scripts: the interpreter of the separate verl environment
        "ARENA_VLLM_MODEL",  # docker-compose.yml: the model the vllm service serves
    }
)
"""``ARENA_*`` environment variables that are not settings; any other unknown one is an error."""
NOT_SETTINGS_ENV_PREFIXES: tuple[str, ...] = ("ARENA_TEST_",)
"""Prefixes of non-setting variables: ``ARENA_TEST_*`` configure the test fixtures."""


def settings_error(loc: str, value: Any, message: str) -> ValidationError:
    """A ``ValidationError`` of ``ArenaSettings`` at ``loc`` saying ``message`` (names the key and the fix)."""
    error = PydanticCustomError("invalid_setting", "{problem}", {"problem": message})
    return ValidationError.from_exception_data(
        "ArenaSettings", [InitErrorDetails(type=error, loc=(loc,), input=value)]
    )


def not_empty(value: Any, name: str) -> Any:
    """``value``, or a ``ValueError`` naming ``ARENA_<NAME>`` when it is an empty string."""
    if isinstance(value, str) and not value.strip():
        raise ValueError(
            f"ARENA_{name.upper()} is set but empty (fix: unset it to use the default, or give it a value)"
        )
    return value


def _section(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _is_dict(annotation: Any) -> bool:
    return typing.get_origin(annotation) is dict or annotation is dict


def setting_keys() -> list[str]:
    """Every settings key, dotted for sections (``home``, ``sft.walks``)."""
    keys: list[str] = []
    for name, info in ArenaSettings.model_fields.items():
        section = _section(info.annotation)
        keys.extend([f"{name}.{sub}" for sub in section.model_fields] if section else [name])
    return keys


def env_name(key: str) -> str:
    """The environment variable of a dotted settings key: ``sft.walks`` -> ``ARENA_SFT__WALKS``."""
    return "ARENA_" + key.replace(".", "__").upper()


def _leaf(name: str) -> str:
    return name.rsplit("__", 1)[-1].rsplit(".", 1)[-1].removeprefix("ARENA_").lower()


def _suggest(word: str, choices: list[str]) -> str:
    """`` (did you mean X?)``: the closest choice by whole name (else by its last part), and the
    other choices with the same last part (``max_turns`` is in three sections)."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if not close:
        best = difflib.get_close_matches(_leaf(word), sorted({_leaf(c) for c in choices}), n=1, cutoff=0.75)
        close = [c for c in choices if best and _leaf(c) == best[0]][:1]
    if not close:
        return ""
    same = [c for c in choices if _leaf(c) == _leaf(close[0]) and c != close[0]]
    return f" (did you mean {' or '.join([close[0], *same][:3])}?)"


def did_you_mean(key: str) -> str:
    """`` (did you mean X?)`` for a dotted key that names no setting ('' when nothing is close)."""
    return _suggest(key, setting_keys())


def unknown_env_vars(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """``(variable, message)`` for each ``ARENA_*`` variable that is no setting and not allow-listed."""
    keys = setting_keys()
    known = {env_name(k) for k in keys}
    dict_prefixes = tuple(
        f"ARENA_{name.upper()}__"
        for name, info in ArenaSettings.model_fields.items()
        if _is_dict(info.annotation)
    )
    names = sorted(known)
    problems = []
    for var in sorted(environ):
        upper = var.upper()
        if not upper.startswith("ARENA_") or upper in known or upper in NOT_SETTINGS_ENV:
            continue
        if upper.startswith(NOT_SETTINGS_ENV_PREFIXES + dict_prefixes):
            continue
        problems.append(
            (var, f"{var} is not an Arena setting{_suggest(upper, names)} (fix: rename or unset it)")
        )
    return problems


def _annotation(key: str) -> Any:
    """The type of a dotted settings key (``sft.walks``, ``llm_roles``)."""
    name, _, sub = key.partition(".")
    annotation = ArenaSettings.model_fields[name].annotation
    section = _section(annotation)
    return section.model_fields[sub].annotation if section and sub else annotation


def unparsable_env_vars(environ: Mapping[str, str]) -> list[str]:
    """The set ``ARENA_*`` variables of list or mapping settings whose value is not JSON.

    pydantic-settings parses those values as JSON and, when one fails, names only its field or
    section (``envs``), so the CLI finds the variable itself."""
    kinds = {env_name(k): _annotation(k) for k in setting_keys()}
    bad = []
    for var, value in environ.items():
        kind = kinds.get(var.upper())
        if typing.get_origin(kind) in (list, dict) or kind in (list, dict):
            try:
                json.loads(value)
            except ValueError:
                bad.append(var)
    return sorted(bad)


def unknown_file_keys(data: Mapping[str, Any], file: Path) -> list[tuple[str, str]]:
    """``(key, message)`` for each key of a settings file that names no setting."""
    keys = setting_keys()
    problems = []
    for name, value in data.items():
        info = ArenaSettings.model_fields.get(name)
        if info is None:
            problems.append(
                (name, f"{file}: unknown key {name!r}{_suggest(name, keys)} (fix: rename or remove it)")
            )
            continue
        section = _section(info.annotation)
        if section is None or not isinstance(value, Mapping):
            continue
        for sub in value:
            if sub not in section.model_fields:
                dotted = f"{name}.{sub}"
                problems.append(
                    (
                        dotted,
                        f"{file}: unknown key [{name}] {sub!r}{_suggest(dotted, keys)} (fix: rename or remove it)",
                    )
                )
    return problems


def _raise_all(problems: list[tuple[str, str]]) -> None:
    """One ``ValidationError`` listing every ``(key, message)``; the input shown is the key, never
    its value (a mistyped ``ARENA_LLM_API_KEY`` holds a secret)."""
    if problems:
        details = [
            InitErrorDetails(
                type=PydanticCustomError("unknown_setting", "{problem}", {"problem": message}),
                loc=(loc,),
                input=loc,
            )
            for loc, message in problems
        ]
        raise ValidationError.from_exception_data("ArenaSettings", details)


class EnvCheck(PydanticBaseSettingsSource):
    """A source that reads nothing: it refuses unknown ``ARENA_*`` environment variables."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        _raise_all(unknown_env_vars(os.environ))
        return {}


class StrictTomlSource(TomlConfigSettingsSource):
    """The settings file; a key that names no setting is an error, with the closest valid key."""

    def __init__(self, settings_cls: type[BaseSettings], toml_file: Path) -> None:
        self.file = toml_file
        super().__init__(settings_cls, toml_file=toml_file)

    def __call__(self) -> dict[str, Any]:
        data = super().__call__()
        _raise_all(unknown_file_keys(self.toml_data, self.file))
        return data


def load_settings(**overrides: Any) -> ArenaSettings:
    return ArenaSettings(**overrides)
