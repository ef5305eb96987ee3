"""`arena train`: the continuous training service (ASTRA §3, EigenData §5).

Dataflow::

    samples.sft      --(SFT, cosine + warmup)-------------------\\
    samples.verified --(rollouts in the sandbox, rewards,          +--> weights + state in the lake,
                        adaptive batch filling, GRPO update)-----/      trainer.metrics, catalog rows

Phases: SFT until ``sft_steps`` steps are done or ``samples.sft`` runs dry,
then GRPO for as long as the service runs. Each step:

1. takes samples from the topic (offsets tracked per partition);
2. SFT: one update on the batch; GRPO: rollout rounds of ``n`` prompts x G
   trajectories until the filler holds exactly ``n`` valid groups (adaptive batch
   filling; a drained run's last short batch only with ``final_short_batch``);
3. writes a step record (what it consumed, trained, filtered, dropped),
   publishes metrics, and saves weights / the full state on their cadence.

With ``max_off_policy_steps`` = s > 0 the rollout rounds of step t+1 run while
step t's update does, on the weights of step t-s (``trainer.rollout_weights``);
step t's record and checkpoint hold the offsets, batch buffer and RNG as step t's
own rounds left them, so the prefetched samples are rolled out again on resume.

On start the newest full state is loaded and both sources seek to its
offsets; step records and checkpoints after it are deleted, so a run killed
with ``kill -9`` redoes the lost steps and every consumed sample ends up in
exactly one step record.

The user of interactive rollouts (EigenData §5) is fixed when GRPO starts
(``train.user_simulator``): with ``auto``, a frozen copy of the policy as it was
at the end of SFT when SFT trained on user-simulator samples (``role_target =
user``), else the gateway's ``user_simulator`` role. The frozen copy never
receives GRPO updates (user tokens are context, mask 0, in the agent's
trajectories). Its weights are saved as the weights checkpoint of the last SFT
step and the choice (kind, step) is part of the full state, so ``--resume``
reloads the same user; every GRPO step's metrics say which user it had.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import signal
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import torch
from aiokafka import AIOKafkaProducer
from pydantic import BaseModel, Field
from rich.console import Console

from arena.config import ArenaSettings
from arena.files import scratch_dir
from arena.hashing import content_hash
from arena.metrics import trainer_step as export_step
from arena.records.envs import VerifiedSample
from arena.records.sft import SftSample
from arena.records.trainer import TrainerMetrics
from arena.versions import MAIN, wire
from lake.catalog import Catalog
from lake.store import ClaimCheck, open_store
from streams.runtime import Emit, encode
from trainer.batching import BatchFiller, Group, is_valid
from trainer.checkpoint import Checkpoints, StepRecord
from trainer.decontam import trainer_screen
from trainer.episodes import Episodes
from trainer.learner import Learner
from trainer.policy import HfBackend
from trainer.preflight import NoCheckpoint, check_model_setting, no_state
from trainer.rollout_log import save_rollouts
from trainer.samples_source import STAGE, STAGE_VERSION, SampleSource, Taken
from trainer.sft import sft_example
from trainer.user_sim import PolicyUserSimulator

Phase = Literal["sft", "grpo"]
UserSimKind = Literal["gateway", "policy"]


class UserSimChoice(BaseModel):
    """The user simulator of a run's GRPO phase, as recorded in its full state."""

    kind: Annotated[UserSimKind, Field(description="gateway: the LLM role; policy: the frozen SFT policy.")]
    sft_step: Annotated[
        int | None,
        Field(
            ge=0,
            description="policy: the step whose weights checkpoint holds the frozen user (the last SFT step; "
            "0 = the run's base model); None for gateway.",
        ),
    ] = None


def user_simulator_kind(setting: Literal["auto", "gateway", "policy"], sft_user_samples: int) -> UserSimKind:
    """``auto`` -> policy when SFT trained on user-simulator samples (it learned to speak as the user)."""
    if setting == "auto":
        return "policy" if sft_user_samples > 0 else "gateway"
    return setting


class TrainOptions(BaseModel):
    """How this invocation of the service runs (the knobs live in ``settings.train``)."""

    tiny: Annotated[bool, Field(description="Build a tiny local model when the run has none yet.")] = False
    steps: Annotated[
        int | None, Field(ge=1, description="Stop once the run reaches this many optimizer steps.")
    ] = None
    until_drained: Annotated[
        bool, Field(description="Stop when both topics are drained (leftover valid groups train first).")
    ] = False
    resume: Annotated[bool, Field(description="Require a checkpoint to resume from.")] = False
    wait_s: Annotated[float, Field(gt=0, description="How long one poll for new samples waits.")] = 2.0
    version: Annotated[
        str,
        Field(
            description="The data version whose samples it trains on (``arena.versions``); a run trains "
            "on one version only: switching is a new run."
        ),
    ] = MAIN


@dataclass
class StepView:
    """What a step's checkpoint and record hold: the sources' offsets, the batch buffer and the RNG
    as that step left them (with rollouts of the next step overlapping it, not the live ones)."""

    offsets: dict[str, dict[int, int]]
    filler: dict[str, Any]
    rng: dict[str, Any]


@dataclass
class Fill:
    """The rollout rounds of one GRPO step."""

    at_start: StepView
    consumed: list[str] = field(default_factory=list)
    filtered: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    rolled: list[Group] = field(default_factory=list)
    recorded: list[dict[str, Any]] = field(default_factory=list)
    drained: bool = False
    rounds: int = 0
    rollout_s: float = 0.0
    overlapped: bool = False
    at_end: StepView | None = None


class TrainerService:
    """Owns the model, optimizer, sources and checkpoints of one run."""

    def __init__(
        self, settings: ArenaSettings, bootstrap: str, options: TrainOptions, console: Console
    ) -> None:
        self.settings = settings
        self.cfg = settings.train
        self.bootstrap = bootstrap
        self.options = options
        self.console = console
        self.store = open_store(settings)
        # Model copies go under $ARENA_HOME/tmp: a kill -9 leaves them there, and the next start
        # removes them (arena.files.scratch_dir), where /tmp would keep a copy per crash.
        self._tmp = scratch_dir(settings.home, "train")
        self.checkpoints = Checkpoints(
            self.store, settings.catalog, self.cfg.run, scratch=Path(self._tmp.name)
        )
        self.catalog = Catalog(settings.catalog)
        self.stop = asyncio.Event()
        self.step = 0
        self.sft_step = 0
        self.sft_user_samples = 0
        self.user_sim: UserSimChoice | None = None
        self.phase: Phase = "sft" if self.cfg.sft_steps > 0 else "grpo"
        self.filler = BatchFiller(self.cfg.batch_groups, self.cfg.delta)
        self.learner: Learner | None = None
        self.episodes: Episodes | None = None
        self.sources: dict[str, SampleSource[Any]] = {}
        self._prefetch: asyncio.Task[Fill] | None = None
        """The next GRPO step's rollout rounds, running during this step's update (s > 0)."""

    # --- set-up -----------------------------------------------------------
    @staticmethod
    def _quiet_transformers() -> None:
        """The service prints one line per step; transformers' shard bars would interleave with it."""
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()

    def _load(self) -> dict[str, dict[int, int]]:
        """Load the model (and the newest state, if any); returns the offsets to seek to."""
        self._quiet_transformers()
        state_step = self.checkpoints.latest_state()
        if self.options.resume and state_step is None:
            raise no_state(self.cfg.run)
        folder = self._base_folder()
        self.learner = Learner.load(folder, self.cfg)
        self.episodes = Episodes(self.settings, self.learner)
        if state_step is None:
            self.learner.new_optimizer(self.phase)
            if self.phase == "grpo":  # no SFT phase: GRPO starts now
                self.learner.start_rollouts(self.step)
                self._start_user_simulator()
            return {}
        state = self.checkpoints.load_state(state_step)
        trained_on = state.get("data_version", MAIN)
        if trained_on != self.options.version:
            raise NoCheckpoint(
                f"run {self.cfg.run!r} trains on data version {trained_on!r}, not "
                f"{self.options.version!r}: a run never mixes versions (fix: --run NEW_NAME for a run "
                f"on {self.options.version!r})"
            )
        removed = self.checkpoints.truncate_after(state_step)
        self.step, self.sft_step, self.phase = state["step"], state["sft_step"], state["phase"]
        self.sft_user_samples = int(state.get("sft_user_samples", 0))
        self.learner.load_state(state, self.phase)
        self.filler.load_state_dict(state["filler"])
        _set_rng(state["rng"])
        if self.phase == "grpo":
            self._restore_user_simulator(state.get("user_sim"))
        self.console.print(
            f"[cyan]resumed[/cyan] run {self.cfg.run!r} at step {self.step} ({self.phase}); "
            f"{removed} newer objects of the lost lineage removed"
        )
        offsets: dict[str, dict[int, int]] = state["offsets"]
        return offsets

    def _base_folder(self) -> Path:
        dest = Path(self._tmp.name) / "base"
        if self.checkpoints.has_base():
            return self.checkpoints.base_folder(dest)
        check_model_setting(self.settings, tiny=self.options.tiny)
        if self.cfg.model:
            from trainer.pretrained import hf_folder

            # a Hugging Face folder as is; a GGUF file or a bundled model converted once
            self.checkpoints.save_base(hf_folder(self.cfg.model, self.settings.home))
            return self.checkpoints.base_folder(dest)
        from trainer.tiny import build_tiny, lake_texts

        build_tiny(dest, lake_texts(self.store), seed=self.settings.seed)
        self.checkpoints.save_base(dest)
        self.console.print(
            f"[cyan]built a tiny model[/cyan] for run {self.cfg.run!r} (tokenizer from the lake)"
        )
        return dest

    # --- main loop --------------------------------------------------------
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # before loading: a stop while loading exits cleanly
            loop.add_signal_handler(sig, self.stop.set)
        offsets = await asyncio.to_thread(self._load)
        assert self.learner is not None and self.episodes is not None
        params = {**self.cfg.model_dump(), "data_version": self.options.version}
        run_id = self.catalog.start_run("train", self.cfg.run, params)
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True)
        await producer.start()
        self.producer = producer
        group = self.cfg.group_id
        claims = ClaimCheck.from_settings(self.settings)  # large samples travel as claims to the lake
        # Once `arena decontam index` ran: no benchmark twins (in a thread: it reads the saved embeddings,
        # or embeds the items of an index saved without them).
        screen = await asyncio.to_thread(trainer_screen, self.settings.home)
        self.sources = {
            name: SampleSource(
                self.bootstrap,
                wire(name, self.options.version),
                group_id=group,
                offsets=offsets.get(name),
                claims=claims,
                screen=screen,
            )
            for name in ("samples.sft", "samples.verified")
        }
        status = "failed"
        try:
            for source in self.sources.values():
                await source.start(producer)
            await self.episodes.start()
            await self._loop()
            status = "succeeded"
        finally:
            if self._prefetch is not None:  # an error ended the loop while the next step rolled out
                self._prefetch.cancel()
                with contextlib.suppress(BaseException):
                    await self._prefetch
            if status == "succeeded" or self.stop.is_set():
                await self._checkpoint(force=True)
            for source in self.sources.values():
                await source.stop()
            await self.episodes.close()
            await producer.stop()
            self.catalog.finish_run(run_id, status)
            self.catalog.dispose()
            self.checkpoints.dispose()
            self._tmp.cleanup()
        return 0

    def _done(self) -> bool:
        return self.stop.is_set() or (self.options.steps is not None and self.step >= self.options.steps)

    async def _loop(self) -> None:
        while not self._done():
            if self.phase == "sft":
                if self.sft_step >= self.cfg.sft_steps or not await self._sft_step():
                    await self._enter_grpo()
                continue
            if not await self._grpo_step():
                break  # drained
        if self._prefetch is not None:  # stopping: the next step's rounds are no step
            fill = await self._prefetch
            self._prefetch = None
            await self._abandon_step(fill)

    async def _enter_grpo(self) -> None:
        assert self.learner is not None
        self.phase = "grpo"
        self.learner.new_optimizer("grpo")
        self.learner.start_rollouts(self.step)
        self.console.print(
            f"[cyan]SFT done[/cyan] after {self.sft_step} steps; GRPO from step {self.step + 1}"
        )
        await asyncio.to_thread(self._start_user_simulator)

    # --- the user of interactive rollouts ----------------------------------
    def _start_user_simulator(self) -> None:
        """Fix the GRPO phase's user now, at the end of SFT (see the module docstring).

        The policy user is a copy of the weights in memory; they are also saved as this step's
        weights checkpoint (overwriting one a lost lineage may have left there), which is what a
        resume reloads. Step 0 (no SFT step ran) is the run's base model, already in the lake.
        """
        assert self.learner is not None
        kind = user_simulator_kind(self.cfg.user_simulator, self.sft_user_samples)
        if kind == "gateway":
            self._use_user_simulator(UserSimChoice(kind="gateway"), None)
            return
        if self.step > 0:
            self.checkpoints.save_weights(self.step, "sft", self.learner.model, self.learner.tokenizer)
        self._use_user_simulator(
            UserSimChoice(kind="policy", sft_step=self.step), self.learner.frozen_backend()
        )

    def _restore_user_simulator(self, recorded: dict[str, Any] | None) -> None:
        """Resume: the user the run's GRPO phase started with (its frozen weights from the lake)."""
        assert self.learner is not None
        if recorded is None:  # a state written before the choice was recorded: the user then was the gateway
            self._use_user_simulator(UserSimChoice(kind="gateway"), None)
            return
        choice = UserSimChoice.model_validate(recorded)
        if choice.kind == "gateway" or choice.sft_step is None:
            self._use_user_simulator(UserSimChoice(kind="gateway"), None)
            return
        dest = Path(self._tmp.name) / f"user-{choice.sft_step}"
        try:
            if choice.sft_step == 0:
                folder = self.checkpoints.base_folder(dest)
            else:
                folder = self.checkpoints.weights_folder(choice.sft_step, dest)
            backend = self.learner.load_frozen(folder)
        finally:
            shutil.rmtree(dest, ignore_errors=True)  # loaded into memory; the lake keeps the folder
        self._use_user_simulator(choice, backend)

    def _use_user_simulator(self, choice: UserSimChoice, backend: HfBackend | None) -> None:
        assert self.learner is not None and self.episodes is not None
        self.user_sim = choice
        user = None
        if backend is not None:
            user = PolicyUserSimulator(
                backend,
                self.learner.tokenizer,
                max_new_tokens=self.cfg.max_new_tokens,
                max_seq_len=self.cfg.max_seq_len,
                temperature=self.cfg.temperature,
                seed=self.settings.seed,
                lock_with=self.learner.backend,  # one generation at a time: both seed torch's global RNG
            )
        self.episodes.use_user_simulator(user)
        where = f"the policy frozen at step {choice.sft_step}" if user is not None else "the gateway's role"
        self.console.print(f"[cyan]user simulator[/cyan] of interactive rollouts: {where}")

    def _user_sim_metrics(self) -> dict[str, float]:
        """Which user the step's interactive rollouts had (1 = the frozen SFT policy, 0 = the gateway)."""
        if self.user_sim is None:
            return {}
        out = {"user_sim_policy": float(self.user_sim.kind == "policy")}
        if self.user_sim.sft_step is not None:
            out["user_sim_sft_step"] = float(self.user_sim.sft_step)
        return out

    # --- SFT --------------------------------------------------------------
    async def _sft_step(self) -> bool:
        """One SFT step; False when samples.sft is dry (the phase ends)."""
        assert self.learner is not None
        learner = self.learner
        source = self.sources["samples.sft"]
        taken: list[Taken[SftSample]] = await source.take(self.cfg.sft_batch, wait_s=self.options.wait_s)
        if not taken:
            # A stop signal keeps the phase (the checkpoint resumes SFT); a dry topic ends it.
            return self.stop.is_set() or await source.pending() > 0
        started = time.perf_counter()
        examples = [sft_example(learner.tokenizer, t.record, self.cfg.max_seq_len) for t in taken]
        loss, tokens = await asyncio.to_thread(learner.sft_backward, examples)
        lr = await asyncio.to_thread(learner.optimizer_step)
        self.step += 1
        self.sft_step += 1
        ids = [t.record.sample_id for t in taken]
        user_samples = sum(1 for t in taken if t.record.role_target == "user")
        self.sft_user_samples += user_samples
        metrics = {"loss": loss, "tokens": float(tokens), "samples": float(len(ids)), "lr": lr}
        metrics["user_samples"] = float(user_samples)
        metrics["step_s"] = time.perf_counter() - started
        await self._finish_step("sft", ids, ids, metrics)
        return True

    # --- GRPO -------------------------------------------------------------
    async def _grpo_step(self) -> bool:
        """Rollout rounds until exactly n valid groups, one update; False once drained.

        ASTRA's adaptive batch filling keeps drawing (waiting on the topic when it is empty) until
        the batch is full. Only a run told to stop when the topic is drained ends with fewer: with
        ``final_short_batch`` they are trained as a short step; without it, or on a stop signal,
        the step is abandoned -- nothing trained, no step counted, the filler and offsets put back
        as the step found them -- so the samples are rolled out again when the run resumes.
        With ``max_off_policy_steps`` > 0 the next step's rounds start as this step's update does.
        """
        assert self.learner is not None
        learner, filler = self.learner, self.filler
        started = time.perf_counter()
        if self._prefetch is not None:
            fill = await self._prefetch
            self._prefetch = None
        else:
            fill = await self._fill(self.step + 1)
        short = not filler.ready() and fill.drained and bool(filler.buffer) and self.cfg.final_short_batch
        if not filler.ready() and not short:
            await self._abandon_step(fill)
            return False
        waiting = [g.sample_id for g in filler.buffer]
        batch = filler.take_short() if short else filler.take()
        trained = [g.sample_id for g in batch]
        carried = {g.sample_id for g in filler.buffer}
        dropped = [i for i in waiting if i not in set(trained) and i not in carried]
        assert fill.at_end is not None
        view = StepView(fill.at_end.offsets, filler.state_dict(), fill.at_end.rng)
        if self._overlap_next(fill):
            # Sync the rollout weights here, not in the task: the checkpoint below reads them.
            behaviour = await asyncio.to_thread(learner.behaviour_step, self.step + 2, self.step)
            self._prefetch = asyncio.create_task(self._fill(self.step + 2, behaviour, overlapped=True))
        t1 = time.perf_counter()
        update: dict[str, float] = {}
        if batch:
            update = await asyncio.to_thread(learner.grpo_step, batch)
        await asyncio.to_thread(learner.push_weights, self.step + 1)  # every step has weights to lag
        update_s = time.perf_counter() - t1
        self.step += 1
        if fill.recorded:  # what the policy was paid for, rescorable with `arena reward score`
            await asyncio.to_thread(
                save_rollouts, self.checkpoints.store, self.checkpoints.prefix, self.step, fill.recorded
            )
        last = filler.last
        metrics = _rollout_metrics(fill.rolled) | update | self._user_sim_metrics()
        metrics |= _staleness(batch, self.step)
        metrics |= {
            "short_batch": float(short),
            "fill_ratio": last.fill_ratio,
            "valid_ratio": last.valid_ratio,
            "groups_trained": float(last.trained_groups),
            "groups_dropped": float(last.dropped_groups),
            "groups_carried": float(len(view.filler["buffer"])),
            "shortfall": float(last.shortfall),
            "rounds": float(last.rounds),
            "rollout_s": fill.rollout_s,
            "rollout_overlapped": float(fill.overlapped),
            "update_s": update_s,
            "step_s": time.perf_counter() - started,
        }
        await self._finish_step(
            "grpo", fill.consumed, trained, metrics, fill.filtered, dropped, fill.skipped, view=view
        )
        return not fill.drained

    def _overlap_next(self, fill: Fill) -> bool:
        """Whether the next step's rounds start now, during this step's update: rollouts may lag
        (s > 0), and that step will run (no stop, not drained, within ``--steps``)."""
        if self.cfg.max_off_policy_steps == 0 or fill.drained or self.stop.is_set():
            return False
        return self.options.steps is None or self.step + 2 <= self.options.steps

    async def _fill(self, step: int, behaviour: int | None = None, *, overlapped: bool = False) -> Fill:
        """Rollout rounds for training step ``step`` until the filler holds n valid groups, the run
        stops, or (``--until-drained``) the topic is dry. ``behaviour``: the step whose weights the
        rollout backend was synced to (None: sync it now)."""
        assert self.learner is not None and self.episodes is not None
        episodes, filler = self.episodes, self.filler
        source = self.sources["samples.verified"]
        if behaviour is None:
            behaviour = await asyncio.to_thread(self.learner.behaviour_step, step, self.step)
        fill = Fill(self._view(), overlapped=overlapped)
        while not filler.ready() and not self.stop.is_set():
            taken: list[Taken[VerifiedSample]] = await source.take(
                self.cfg.batch_groups, wait_s=self.options.wait_s
            )
            if not taken:
                if self.options.until_drained and await source.pending() == 0:
                    fill.drained = True
                    break
                continue
            fill.consumed += [t.record.sample_id for t in taken]
            fill.rounds += 1
            t0 = time.perf_counter()
            groups, why = await episodes.groups(
                [t.record for t in taken], step=step, round_=fill.rounds, behaviour_step=behaviour
            )
            fill.rollout_s += time.perf_counter() - t0
            fill.skipped.update(why)
            fill.rolled += groups
            fill.filtered += [g.sample_id for g in groups if not is_valid(g, filler.delta)]
            filler.add(groups)
        fill.recorded = episodes.take_recorded()
        fill.at_end = self._view()
        return fill

    async def _abandon_step(self, fill: Fill) -> None:
        """A step that cannot fill (stop signal, or drained without ``final_short_batch``) is no step:
        the filler, the source position and the RNG go back to where the step began, so the state
        saved at exit holds none of it and a resumed run rolls the same samples out again."""
        waiting = len(self.filler.buffer)
        start = fill.at_start
        self.filler.load_state_dict(start.filler)
        await self.sources["samples.verified"].rewind(start.offsets["samples.verified"])
        _set_rng(start.rng)
        self.console.print(
            abandoned_step_line(
                stopping=self.stop.is_set(),
                waiting=waiting,
                batch_groups=self.cfg.batch_groups,
                consumed=len(fill.consumed),
                final_short_batch=self.cfg.final_short_batch,
            )
        )

    def _view(self) -> StepView:
        """The live offsets, batch buffer and RNG."""
        offsets = {name: s.offsets for name, s in self.sources.items()}
        return StepView(offsets, self.filler.state_dict(), _rng_state())

    # --- bookkeeping ------------------------------------------------------
    async def _finish_step(
        self,
        phase: Phase,
        consumed: list[str],
        trained: list[str],
        metrics: dict[str, float],
        filtered: list[str] | None = None,
        dropped: list[str] | None = None,
        skipped: dict[str, str] | None = None,
        view: StepView | None = None,
    ) -> None:
        view = view or self._view()
        record = StepRecord(
            step=self.step,
            phase=phase,
            consumed=consumed,
            trained=trained,
            filtered=filtered or [],
            dropped=dropped or [],
            skipped=skipped or {},
            offsets=view.offsets,
            metrics=metrics,
        )
        await asyncio.to_thread(self.checkpoints.save_step, record)
        await self._publish_metrics(phase, metrics)
        export_step(self.cfg.run, phase, self.step, metrics)
        await self._checkpoint(view=view)
        self._print(phase, metrics)

    async def _publish_metrics(self, phase: Phase, metrics: dict[str, float]) -> None:
        value = TrainerMetrics(
            run_id=self.cfg.run, step=self.step, metrics=metrics | {"phase_grpo": float(phase == "grpo")}
        )
        emit = Emit("trainer.metrics", content_hash([self.cfg.run, self.step]), value)
        key, data, headers = encode(emit, stage=STAGE, stage_version=STAGE_VERSION)
        await (await self.producer.send("trainer.metrics", data, key=key, headers=headers))

    async def _checkpoint(self, force: bool = False, view: StepView | None = None) -> None:
        """Weights and full state on their cadence (``force``: both now); ``view``: the step's own
        offsets, buffer and RNG (default: the live ones)."""
        assert self.learner is not None
        if self.step == 0:
            return
        learner = self.learner
        if self.step % self.cfg.weights_every == 0 or force:
            if self.step not in self.checkpoints.weights_steps():
                await asyncio.to_thread(
                    self.checkpoints.save_weights, self.step, self.phase, learner.model, learner.tokenizer
                )
        if self.step % self.cfg.state_every == 0 or force:
            if self.checkpoints.latest_state() != self.step:
                view = view or self._view()
                state = self._state(view)
                await asyncio.to_thread(
                    self.checkpoints.save_state, self.step, self.phase, state, self.cfg.keep_states
                )
                for name, source in self.sources.items():
                    await source.commit(view.offsets.get(name))

    def _state(self, view: StepView | None = None) -> dict[str, Any]:
        assert self.learner is not None
        view = view or self._view()
        return {
            "step": self.step,
            "sft_step": self.sft_step,
            "sft_user_samples": self.sft_user_samples,
            "user_sim": self.user_sim.model_dump() if self.user_sim is not None else None,
            "phase": self.phase,
            "filler": view.filler,
            "offsets": view.offsets,
            "rng": view.rng,
            "train": self.cfg.model_dump(),
            "data_version": self.options.version,
        } | self.learner.state_dict()

    def _print(self, phase: Phase, m: dict[str, float]) -> None:
        if phase == "sft":
            text = f"loss {m['loss']:.4f}  tokens {m['tokens']:.0f}  lr {m['lr']:.2e}"
        else:
            text = (
                f"reward {m.get('reward_mean', 0):.3f}±{m.get('reward_std', 0):.3f}  "
                f"fill {m.get('fill_ratio', 0):.2f}  loss {m.get('loss', 0):+.4f}  "
                f"turns {m.get('turns_mean', 0):.1f}"
            )
        self.console.print(f"step {self.step:>5} {phase:<4} {text}  {m['step_s']:.1f}s")


def _rollout_metrics(groups: list[Group]) -> dict[str, float]:
    rows = [r for g in groups for r in g.rollouts]
    if not rows:
        return {}
    rewards = [float(r["reward"]) for r in rows]
    out = {
        "reward_mean": statistics.fmean(rewards),
        "reward_std": statistics.pstdev(rewards),
        "turns_mean": statistics.fmean(float(r["turns"]) for r in rows),
        "tool_calls_mean": statistics.fmean(float(r["tool_calls"]) for r in rows),
        "response_tokens_mean": statistics.fmean(float(sum(r["response_mask"])) for r in rows),
        "trajectories": float(len(rows)),
    }
    for part in ("f1", "recall", "precision"):
        values = [float(r["reward_parts"][part]) for r in rows if part in r.get("reward_parts", {})]
        if values:
            out[part] = statistics.fmean(values)
    return out


def _staleness(batch: list[Group], step: int) -> dict[str, float]:
    """How many updates behind the weights being trained (those of step - 1) the batch's rollouts
    were generated: 0 on-policy, 1 for a group the buffer carried over, up to s more when lagged."""
    lags = [step - 1 - g.behaviour_step for g in batch if g.behaviour_step is not None]
    if not lags:
        return {}
    return {"staleness_mean": statistics.fmean(lags), "staleness_max": float(max(lags))}


def _rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def abandoned_step_line(
    *, stopping: bool, waiting: int, batch_groups: int, consumed: int, final_short_batch: bool
) -> str:
    """What the console says of a step that trained nothing. The FINAL_SHORT_BATCH hint only where
    it would have trained them: a drained run with valid groups waiting (a stop signal never does)."""
    why = "stopping" if stopping else "samples.verified is drained"
    hint = ""
    if not stopping and waiting and not final_short_batch:
        hint = " (ARENA_TRAIN__FINAL_SHORT_BATCH=true trains them as a short final step)"
    return (
        f"[yellow]{why}[/yellow]: {waiting} of {batch_groups} valid groups after {consumed} new samples; "
        f"no step trained{hint}; they are rolled out again when the run resumes"
    )
