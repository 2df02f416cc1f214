"""`train(config)`: the TTT training loop (single process or DDP), validation, checkpoints, resume.

Output folder (OUT):
    config.json, model.safetensors   the best draft so far (eaglekit's native checkpoint)
    manifest.json                    stage "train": settings, target fingerprint, inputs, metrics
    log.jsonl (+ tb/)                one line per logged step and per validation
    trainer_state/                   what `--resume` needs (see train/state.py)
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import nn

from eaglekit.artifacts import AUX_CONVENTION, clear_folder, write_manifest, writer_lock
from eaglekit.draft.checkpoint import save_draft
from eaglekit.errors import EaglekitError, RunFailed
from eaglekit.features.batch import Batch
from eaglekit.features.teacher import Teacher
from eaglekit.metrics import STATS, metrics_from_stats
from eaglekit.runtime.graphs import check_inductor
from eaglekit.targets.capture import decoder_layers
from eaglekit.train import distributed
from eaglekit.train.attention import check_merged_attention, plan_free_attention
from eaglekit.train.config import TrainConfig
from eaglekit.train.data import BatchPlan, eval_batches
from eaglekit.train.loss import StepOutput, step_counts, ttt_loss
from eaglekit.train.optim import lr_at, make_draft_optimizer
from eaglekit.train.profiling import StepProfiler
from eaglekit.train.setup import Run, prepare
from eaglekit.train.state import latest_state, load_state, restore_rng, save_state
from eaglekit.train.target_cache import attach_target_caches, cache_summary, check_target_cache_supported
from eaglekit.train.tracker import Tracker
from eaglekit.train.ttt import COMPILE_OPTIONS, StepFunctions, compile_guards, compiled_steps, ttt_positions, ttt_unroll

log = logging.getLogger(__name__)


class TTTModel(nn.Module):
    """The unroll as one module, so DDP sees a forward and syncs the draft's gradients."""

    def __init__(self, draft, ttt_steps: int, attention: str = "dense"):
        super().__init__()
        self.draft = draft
        self.ttt_steps = ttt_steps
        self.attention = attention

    def forward(self, aux: torch.Tensor, input_ids: torch.Tensor, positions=None, steps=None) -> list[torch.Tensor]:
        return ttt_unroll(self.draft, aux, input_ids, self.ttt_steps, self.attention, positions, steps)


def unrolled_loss(
    model: nn.Module,
    batch,
    denominators: torch.Tensor,
    *,
    d2t: torch.Tensor,
    t2d: torch.Tensor,
    weights: list[float],
    soft_ce: str = "plain",
    objective: str = "soft-ce",
    every_position: bool = False,
    steps: StepFunctions | None = None,
) -> StepOutput:
    """The draft's part of a training step: the unroll (through `model`, so DDP sees a forward) and its loss.

    TTT steps 1.., the head and the loss run at the positions some step counts (`ttt_positions`);
    every_position=True runs them on the whole [B, L] grid (the same loss and metrics, the reference
    the bench compares with). steps: `ttt.EAGER_STEPS` (None) or `ttt.compiled_steps()`.
    """
    positions = None if every_position else device_positions(batch, len(weights))
    logits = model(batch.aux, batch.input_ids, positions, steps)
    return ttt_loss(
        logits,
        batch,
        d2t,
        t2d,
        weights=weights,
        denominators=denominators,
        soft_ce=soft_ce,
        objective=objective,
        positions=positions,
        steps=steps,
    )


def device_positions(batch, ttt_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`ttt_positions` of a batch, from its host loss mask where it has one (no wait for the device)."""
    if batch.host_loss_mask is None:
        return ttt_positions(batch.loss_mask, ttt_steps)
    device = batch.loss_mask.device
    rows, pos = ttt_positions(batch.host_loss_mask, ttt_steps)
    if device.type == "cuda":
        rows, pos = rows.pin_memory(), pos.pin_memory()
    return rows.to(device, non_blocking=True), pos.to(device, non_blocking=True)


def check_compile_supported(device: torch.device, world_size: int) -> None:
    """--compile runs where it was tested (one process) and where inductor can build kernels; else refuse."""
    if world_size > 1:
        raise EaglekitError(
            "--compile is not verified with DDP (several processes)", hint="train in one process, or drop --compile"
        )
    check_inductor(device, "--compile")


def compiled_unrolled_loss(backend: str = "inductor"):
    """`unrolled_loss` with each TTT step's work compiled (`ttt.compiled_steps`: four graphs that every
    step shares, dynamic in the batch's sizes; the positions are found outside them)."""
    steps = compiled_steps(backend)

    def run(model, batch, denominators, **kw):
        if batch.input_ids.shape[0] == 1:
            batch = with_empty_row(batch)
        return unrolled_loss(model, batch, denominators, **{**kw, "soft_ce": "plain"}, steps=steps)

    return run


def compile_target_layers(model: nn.Module, backend: str = "inductor") -> None:
    """Online --compile: each decoder layer of the target under torch.compile. The layers share one
    graph (dynamo takes each layer's weights as inputs), so the compile lowers one layer, not the
    model; the aux-state hooks run as before."""
    for layer in decoder_layers(model):
        layer.compile(dynamic=True, backend=backend, options=COMPILE_OPTIONS if backend == "inductor" else None)


def with_empty_row(batch: Batch) -> Batch:
    """A one-row batch [1, T] as [2, T], the second row padding that nothing counts: the same loss, stats
    and gradients. Dynamo specializes a size of 1, so the compiled steps would otherwise compile all
    four graphs again for it (a pool's last group, a row as long as the batch)."""

    def pad(x: torch.Tensor, value=0) -> torch.Tensor:
        return torch.cat([x, torch.full_like(x, value)])

    t = batch.teacher
    teacher = Teacher(pad(t.argmax), pad(t.probs), None if t.index is None else pad(t.index))
    host = None if batch.host_loss_mask is None else pad(batch.host_loss_mask, False)
    return Batch(pad(batch.input_ids), pad(batch.loss_mask, False), pad(batch.aux), teacher, pad(batch.lengths), host)


def wrap_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    """DDP without per-forward buffer syncing (d2t/t2d/rotary are identical on every rank)."""
    ddp = nn.parallel.DistributedDataParallel
    kwargs = {"device_ids": [device.index] if device.type == "cuda" else None}
    if "forward_sync_buffers" in inspect.signature(ddp.__init__).parameters:
        kwargs["forward_sync_buffers"] = False
    else:
        kwargs["broadcast_buffers"] = False
    return ddp(model, **kwargs)


class Trainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.dist = distributed.setup(cfg.device)
        self.device = self.dist.device
        self.autocast = cfg.precision == "bf16" or (cfg.precision == "auto" and self.device.type == "cuda")
        self.check_out_folder()
        if cfg.cache_target:  # before the target loads
            check_target_cache_supported(self.dist.world_size)
        self.out.mkdir(parents=True, exist_ok=True)
        self.run: Run = prepare(cfg, self.dist)
        self.target_caches = (
            attach_target_caches([self.run.train, self.run.val], page_locked=self.device.type == "cuda")
            if cfg.cache_target
            else []
        )
        self.draft = self.run.draft.to(self.device)
        if cfg.ttt_attention == "merged":  # private SDPA ops: refuse a PyTorch where they mean something else
            check_merged_attention(self.device, torch.bfloat16 if self.autocast else torch.float32)
        self.model = TTTModel(self.draft, cfg.ttt_steps, cfg.ttt_attention)
        if self.dist.enabled:
            self.model = wrap_ddp(self.model, self.device)
        if cfg.compile:
            check_compile_supported(self.device, self.dist.world_size)
            if cfg.online:
                if cfg.target_device_map:
                    raise EaglekitError(
                        "--compile is not verified with a target sharded over devices",
                        hint="drop --compile or --target-device-map",
                    )
                compile_target_layers(self.run.train.model)
        if cfg.soft_ce == "compiled":
            check_inductor(self.device, "--soft-ce compiled")
        step_loss = compiled_unrolled_loss() if cfg.compile else functools.partial(unrolled_loss, soft_ce=cfg.soft_ce)
        self.step_loss = functools.partial(step_loss, objective=cfg.objective)
        self.optimizer = make_draft_optimizer(
            [(n, p) for n, p in self.draft.named_parameters() if p.requires_grad], cfg
        )
        self.plan = BatchPlan(
            self.run.train.lengths,
            batch_tokens=cfg.batch_tokens,
            max_batch_size=cfg.max_batch_size,
            seed=cfg.seed,
            world_size=self.dist.world_size,
            grad_accum=cfg.grad_accum,
        )
        self.total_steps = cfg.max_steps if cfg.max_steps is not None else self.plan.total_steps(cfg.epochs)
        self.max_steps_cap = self.total_steps  # a time budget may shorten the run, never lengthen it
        self.step = 0
        self.best: dict | None = None
        self.history: list[dict] = []
        self.weights = cfg.step_weights()
        # Offline batches are CPU work (reading shards, mapping the teacher): overlap it with the GPU.
        self.prefetch = not cfg.online and self.device.type == "cuda"
        self.pending: dict = {}
        self.unchecked: tuple[int, torch.Tensor] | None = None  # (step, its [loss, grad norm]) not yet read
        if self.prefetch:
            self.pool = ThreadPoolExecutor(max_workers=1)
        if cfg.resume:
            self.restore()

    # ---- setup -------------------------------------------------------------------------------

    def check_out_folder(self) -> None:
        if self.cfg.resume:
            if latest_state(self.out) is None:
                raise EaglekitError(
                    f"--resume: {self.out} holds no trainer state",
                    hint="start without --resume, or pass the folder of the run to continue",
                )
            return
        if self.out.exists() and any(self.out.iterdir()):
            raise EaglekitError(
                f"{self.out} is not empty",
                hint="pass --resume to continue that run, --overwrite to delete it and start over, or a new --out",
            )

    def warmup_steps(self) -> int:
        if self.cfg.warmup_steps is not None:
            return self.cfg.warmup_steps
        return max(1, int(0.02 * self.total_steps))

    def run_identity(self) -> dict:
        """What the run trains on, beyond its arguments: the target, its input folders' fingerprints,
        the aux layers and the draft vocab. A resume on anything else would mix two runs in one draft."""
        return {
            "target": self.run.fingerprint,
            "inputs": self.run.inputs,
            "aux_layer_ids": list(self.run.aux_layer_ids),
            "draft_vocab": self.run.vocab.summary(),
        }

    def restore(self) -> None:
        folder = latest_state(self.out)
        state, draft_t, opt_t, rng_t = load_state(folder)
        # The target and the input folders are compared by what they hold (run_identity's fingerprints),
        # not where they lie: a run folder copied or moved resumes. States written before the run's
        # identity was stored hold no fingerprints: their paths are compared.
        placed = ("target", "features", "data", "val_data") if "run" in state else ()
        key, was_key = (
            {k: v for k, v in d.items() if k not in placed} for d in (self.cfg.resume_key(), state["config"])
        )
        if was_key != key:
            diff = sorted(k for k in set(was_key) | set(key) if was_key.get(k) != key.get(k))
            raise EaglekitError(
                f"--resume with other settings than the run in {self.out}: {diff}",
                hint="resume with exactly the original arguments",
            )
        now = unplaced(json.loads(json.dumps(self.run_identity())))  # as the state file holds it
        was = unplaced(state.get("run", now))  # older states hold no identity: nothing to compare
        if was != now:
            diff = [k for k in now if was.get(k) != now.get(k)]
            raise EaglekitError(
                f"--resume on other data than the run in {self.out} stopped on: its {', '.join(diff)} "
                f"changed since (the features or conversations were made again?)",
                hint="resume on the folders it started on, or pass --overwrite to train from scratch on these",
            )
        missing = set(self.draft.draft_state_dict()) - set(draft_t)
        if missing:
            raise EaglekitError(f"trainer state lacks {sorted(missing)[:4]}", hint="the state is damaged")
        self.draft.load_state_dict(draft_t, strict=False)
        self.optimizer.load_state_tensors(opt_t, state["optimizer"])
        restore_rng(rng_t)
        self.step = int(state["step"])
        self.total_steps = int(state["total_steps"])
        self.best = state.get("best")
        self.history = state.get("history", [])
        log.info("resumed %s at step %d of %d", self.out, self.step, self.total_steps)

    # ---- one optimizer step ------------------------------------------------------------------

    def amp(self):
        if self.autocast:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def load_batches(self, step: int):
        _, micro = self.plan.micro_batches(step, self.dist.rank)
        with self.target_guards():
            return [self.run.train.batch(indices, self.device) for indices in micro]

    def target_guards(self):
        """Around the online target's forward: `compile_guards` where --compile compiled its layers."""
        return compile_guards() if self.cfg.compile and self.cfg.online else contextlib.nullcontext()

    def batches_of(self, step: int):
        """This rank's batches of `step`; offline ones are read one step ahead in a thread (pure, so resume is exact)."""
        if not self.prefetch:
            return self.load_batches(step)
        pending = self.pending.pop(step, None)
        batches = pending.result() if pending is not None else self.load_batches(step)
        if step + 1 < self.total_steps:
            self.pending = {step + 1: self.pool.submit(self.load_batches, step + 1)}
        return batches

    def step_tokens(self, step: int) -> int:
        """Real tokens of this rank's micro-batches, from the plan (host side: no device sync)."""
        _, micro = self.plan.micro_batches(step, self.dist.rank)
        lengths = self.run.train.lengths
        return sum(lengths[i] for indices in micro for i in indices)

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
        """Forward/backward over this rank's micro-batches; returns (stats, grad norm, tokens, loss): the
        loss is this rank's share of the step's (the objective's value, float64; ranks sum to the step's).

        Nothing here waits for the device (the grad norm stays a tensor until it is logged), so the
        host queues the next batch while the device still works on this one.
        """
        cfg = self.cfg
        batches = self.batches_of(self.step)
        denominators = sum(step_counts(b.loss_mask, cfg.ttt_steps) for b in batches)
        self.dist.all_reduce(denominators)
        stats = torch.zeros(cfg.ttt_steps, len(STATS), dtype=torch.float64, device=self.device)
        loss = torch.zeros((), dtype=torch.float64, device=self.device)
        tokens = self.step_tokens(self.step)
        for n, batch in enumerate(batches):
            sync = n == len(batches) - 1 or not self.dist.enabled
            ctx = self.model.no_sync() if not sync else contextlib.nullcontext()
            with ctx:
                with self.amp():
                    out = self.step_loss(
                        self.model, batch, denominators, d2t=self.draft.d2t, t2d=self.draft.t2d, weights=self.weights
                    )
                # DDP averages gradients over ranks; the loss is already normalized globally.
                (out.loss * self.dist.world_size).backward()
            stats += out.stats
            loss += out.loss.detach()
            del out
        grad_norm = torch.nn.utils.clip_grad_norm_(
            [p for p in self.draft.parameters() if p.requires_grad], cfg.max_grad_norm
        )
        self.optimizer.set_lr(
            functools.partial(
                lr_at,
                self.step,
                warmup_steps=self.warmup_steps(),
                total_steps=self.total_steps,
                schedule=cfg.schedule,
                min_lr_ratio=cfg.min_lr_ratio,
            )
        )
        self.optimizer.step()
        self.optimizer.zero_grad()
        return stats, grad_norm, tokens, loss

    def queue_finite_check(self, stats: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Check step `self.step`'s loss and grad norm for NaN/Inf without making the host wait: its
        values are read once the next step is queued (the device still busy with that one), and
        before anything validates, logs or saves, so no non-finite weight is ever written."""
        values = torch.stack([stats[:, STATS.index("loss_sum")].sum(), grad_norm.detach().to(torch.float64)])
        self.dist.all_reduce(values)  # a NaN on one rank stops every rank at the same step
        self.check_finite()
        self.unchecked = (self.step, values)

    def check_finite(self) -> None:
        """Stop the run at the first step whose loss or grad norm was not finite (`queue_finite_check`)."""
        if self.unchecked is None:
            return
        step, values = self.unchecked
        self.unchecked = None
        loss, norm = values.tolist()
        if math.isfinite(loss) and math.isfinite(norm):
            return
        if not math.isfinite(loss):
            why = (
                f"the loss is {loss}: the training data or the target's states hold non-finite values "
                f"(or the draft overflowed)"
            )
            hint = (
                "recapture the features (`eaglekit features --overwrite`; it refuses NaN in what the target "
                "computes), or lower --lr"
            )
        else:
            why = f"the gradient norm is {norm} (the loss was still finite): the update overflowed"
            hint = "lower --lr, or train in --precision fp32"
        saved = (
            f" the draft saved at step {self.best['step']} is from before it" if self.best else " no draft was saved"
        )
        self.step = step  # the manifest's steps: where it stopped
        if self.dist.main:
            self.write_manifest(final=False, stopped=f"step {step}: {why}")
        raise RunFailed(
            f"training stopped at step {step} of {self.total_steps}: {why}. Nothing is marked "
            f"complete (manifest `complete: false`);{saved}",
            hint=hint,
        )

    @torch.no_grad()
    def validate(self) -> dict | None:
        self.check_finite()
        if self.run.val is None:
            return None
        self.model.eval()
        val = self.run.val
        batches = eval_batches(val.lengths, batch_tokens=self.cfg.batch_tokens, max_batch_size=self.cfg.max_batch_size)
        # --val-ttt-steps may unroll past the trained steps: the draft runs on as served (every step
        # shares its weights). Validation reads the sums (`stats`); the loss's weights go unused.
        steps = self.cfg.val_steps
        stats = torch.zeros(steps, len(STATS), dtype=torch.float64, device=self.device)
        ones = torch.ones(steps, dtype=torch.float64, device=self.device)
        for indices in batches[self.dist.rank :: self.dist.world_size]:
            with self.target_guards():
                batch = val.batch(indices, self.device)
            with self.amp():
                positions = device_positions(batch, steps)
                logits = ttt_unroll(self.draft, batch.aux, batch.input_ids, steps, self.cfg.ttt_attention, positions)
                stats += ttt_loss(
                    logits,
                    batch,
                    self.draft.d2t,
                    self.draft.t2d,
                    weights=self.cfg.step_weights(steps),
                    denominators=ones,
                    walk=True,
                    positions=positions,
                ).stats
        self.model.train()
        return metrics_from_stats(self.dist.all_reduce(stats))

    # ---- outputs -----------------------------------------------------------------------------

    def state_dict_for_save(self) -> dict:
        return {k: v.detach().float() if v.is_floating_point() else v for k, v in self.draft.draft_state_dict().items()}

    def save_trainer_state(self) -> None:
        self.check_finite()
        if not self.dist.main:
            return
        tensors, meta = self.optimizer.state_tensors()
        state = {
            "step": self.step,
            "total_steps": self.total_steps,
            "config": self.cfg.resume_key(),
            "run": self.run_identity(),
            "optimizer": meta,
            "best": self.best,
            "history": self.history,
        }
        save_state(
            self.out, step=self.step, draft_tensors=self.state_dict_for_save(), optimizer_tensors=tensors, state=state
        )
        self.write_manifest(final=False)  # a killed run's manifest says where its trainer state stopped

    def write_manifest(self, *, final: bool, train_metrics: dict | None = None, stopped: str | None = None) -> dict:
        extra = {
            "complete": final,
            **({"stopped": stopped} if stopped else {}),
            "aux_layer_ids": self.run.aux_layer_ids,
            "aux_layer_convention": AUX_CONVENTION,
            "draft_vocab": self.run.vocab.summary(),
            "best": self.best,
            "history": self.history,
            "train_metrics": train_metrics,
            "steps": {"done": self.step, "total": self.total_steps, "per_epoch": round(self.plan.steps_per_epoch(), 3)},
            "world_size": self.dist.world_size,
            "optimizers": self.optimizer.names(),  # which trains which parameters (a frozen lm_head is in none)
            "trainable_parameters": sum(p.numel() for p in self.draft.parameters() if p.requires_grad),
            "target_cache": cache_summary(self.target_caches) if self.cfg.cache_target else None,
        }
        counts = dict(self.run.counts)
        return write_manifest(
            self.out,
            stage="train",
            config=self.cfg.to_dict(),
            target=self.run.fingerprint,
            inputs=self.run.inputs,
            counts=counts,
            extra=extra,
        )

    @staticmethod
    def selection(metrics: dict) -> float:
        """What "best" means: the accept length greedy chain decoding gets on the held-out data
        (`walk_accept_length`, which tracks an engine's measurement), else the per-position estimate."""
        walk = metrics.get("walk_accept_length")
        return walk if walk is not None else metrics["sim_accept_length"]

    def better(self, metrics: dict) -> bool:
        return self.best is None or self.selection(metrics) > self.selection(self.best)

    def save_best(self, metrics: dict) -> None:
        self.best = {"step": self.step, **metrics}
        if self.dist.main:  # the manifest first: a kill between the two leaves a folder marked unfinished
            self.write_manifest(final=False)
            save_draft(self.draft, self.out)

    def record_validation(self, metrics: dict, tracker: Tracker) -> None:
        """Keep a validation in the history and the log; save the draft when it is the best so far."""
        self.history.append({"step": self.step, **metrics})
        tracker.event("val", self.step, **metrics)
        if self.better(metrics):
            self.save_best(metrics)

    # ---- the loop ----------------------------------------------------------------------------

    def fit(self) -> dict:
        cfg = self.cfg
        main = self.dist.main
        tracker = Tracker(
            self.out, total_steps=self.total_steps, start_step=self.step, progress=cfg.progress and main, enabled=main
        )
        self.model.train()
        started = time.perf_counter()
        window = torch.zeros(cfg.ttt_steps, len(STATS), dtype=torch.float64, device=self.device)
        window_loss = torch.zeros(1, dtype=torch.float64, device=self.device)  # the objective's, summed over steps
        window_tokens, window_steps, window_start = 0, 0, time.perf_counter()
        train_metrics = None
        # Time budget: size the schedule from the measured speed, refined as the run settles.
        refits = [] if cfg.time_budget_s is None else budget_refits(self.step, self.max_steps_cap)
        last_fit = None
        if self.device.type == "cuda":  # a stage before this one in the same process (generate's cache) set the peak
            torch.cuda.reset_peak_memory_stats(self.device)
        profiler = StepProfiler(cfg.profile_steps, self.out, self.device) if cfg.profile_steps and main else None
        if profiler is not None:
            profiler.start(self.step)
        try:
            if self.total_steps == 0 and self.run.val is not None:  # --max-steps 0: validate only
                metrics = self.validate()
                self.history.append({"step": 0, **metrics})
                tracker.event("val", 0, **metrics)
                self.save_best(metrics)
            while self.step < self.total_steps:
                stats, grad_norm, tokens, loss = self.train_step()
                self.step += 1
                self.queue_finite_check(stats, grad_norm)
                window += stats
                window_loss += loss
                window_tokens += tokens
                window_steps += 1
                if cfg.time_budget_s is not None and last_fit is None:
                    # The first step holds the start-up (a --compile run compiles in it, minutes on a
                    # GPU: docs/notes/training.md): fits measure the pace after it, or they size the run
                    # to a few steps.
                    last_fit = (self.step, time.perf_counter())
                elif (refits and self.step == refits[0]) or self.ends_early(started):
                    while refits and refits[0] <= self.step:
                        refits.pop(0)
                    self.fit_budget(started, last_fit, tracker)
                    last_fit = (self.step, time.perf_counter())
                if self.step % cfg.log_every == 0 or self.step == self.total_steps:
                    self.check_finite()
                    counts = torch.cat(
                        [
                            window.flatten(),
                            window_loss,
                            torch.tensor([float(window_tokens)], dtype=torch.float64, device=self.device),
                        ]
                    )
                    self.dist.all_reduce(counts)
                    elapsed = time.perf_counter() - window_start
                    train_metrics = metrics_from_stats(counts[:-2].view_as(window))
                    tok_s = float(counts[-1]) / max(elapsed, 1e-9)
                    memory = (
                        {"max_mem_gib": round(torch.cuda.max_memory_allocated(self.device) / 2**30, 2)}
                        if self.device.type == "cuda"
                        else {}
                    )
                    tracker.event(
                        "train",
                        self.step,
                        lr=self.optimizer.lr(),
                        **({"muon_lr": self.optimizer.lr("muon")} if "muon" in self.optimizer.parts else {}),
                        loss=round(float(counts[-2]) / window_steps, 5),  # the objective's mean a step
                        grad_norm=float(grad_norm),
                        tokens_per_s=round(tok_s, 1),
                        elapsed_s=round(time.perf_counter() - started, 2),
                        **memory,
                        **train_metrics,
                    )
                    tracker.progress(
                        0,
                        tok_s=f"{tok_s:.0f}",
                        acc0=f"{train_metrics['acc'][0]:.3f}",
                        tau=f"{train_metrics['sim_accept_length']:.2f}",
                    )
                    window.zero_()
                    window_loss.zero_()
                    window_tokens, window_steps, window_start = 0, 0, time.perf_counter()
                tracker.progress(1)
                last = self.step == self.total_steps
                if self.run.val is not None and (self.step % cfg.val_every == 0 or last):
                    self.record_validation(self.validate(), tracker)
                if self.step % cfg.save_every == 0 or last:
                    self.save_trainer_state()
                if profiler is not None:
                    profiler.after_step(self.step)
                if cfg.time_budget_s is not None and not last and self.out_of_time(started):
                    log.warning("time budget of %.0f s reached at step %d; stopping", cfg.time_budget_s, self.step)
                    self.total_steps = self.step
                    metrics = self.validate()
                    if metrics is not None:
                        self.record_validation(metrics, tracker)
                    self.save_trainer_state()
                    break
            self.check_finite()
            if self.run.val is None and main:
                # No held-out data: the last weights are the output, judged by training metrics.
                self.best = {"step": self.step, **(train_metrics or {}), "source": "train"}
                save_draft(self.draft, self.out)
            manifest = self.write_manifest(final=True, train_metrics=train_metrics) if main else {}
        finally:
            tracker.close()
            if profiler is not None:
                profiler.close(self.step)
            if self.prefetch:
                self.pool.shutdown(wait=True, cancel_futures=True)
        self.dist.barrier()
        self.dist.close()
        return manifest

    def out_of_time(self, started: float) -> bool:
        """Rank 0's clock decides, so every rank stops at the same step."""
        over = time.perf_counter() - started > self.cfg.time_budget_s
        return self.dist.broadcast_float(1.0 if over else 0.0) > 0.5

    def ends_early(self, started: float) -> bool:
        """The schedule's last step with more than a tenth of the time budget left: fit again before
        stopping (a pace measured while the run still compiled or warmed up was too slow)."""
        if self.cfg.time_budget_s is None or self.step != self.total_steps or self.step >= self.max_steps_cap:
            return False
        left = self.cfg.time_budget_s - (time.perf_counter() - started)
        return self.dist.broadcast_float(left) > 0.1 * self.cfg.time_budget_s

    def fit_budget(self, started: float, last_fit: tuple[int, float] | None, tracker: Tracker) -> None:
        """Size the schedule to the time budget (rank 0 decides).

        Each fit uses the speed since the fit before (the first, since the end of the first step),
        without start-up costs and with the validations and checkpoints made meanwhile.
        """
        now = time.perf_counter()
        step0, t0 = last_fit or (0, started)
        per_step = (now - t0) / max(self.step - step0, 1)
        remaining = self.cfg.time_budget_s - (now - started)
        fit = self.step + int(0.95 * remaining / per_step)  # a little slack for the final validation
        fit = min(int(self.dist.broadcast_float(float(fit))), self.max_steps_cap)
        if fit != self.total_steps:
            log.info("time budget: %.3f s/step -> %d steps (was %d)", per_step, fit, self.total_steps)
            self.total_steps = max(fit, self.step + 1)
            tracker.set_total(self.total_steps)


def unplaced(identity: dict) -> dict:
    """A run's identity without where its input folders lie (their fingerprints' `path`)."""
    inputs = {
        k: {f: v for f, v in fp.items() if f != "path"} if isinstance(fp, dict) else fp
        for k, fp in (identity.get("inputs") or {}).items()
    }
    return {**identity, "inputs": inputs}


# Refit the time budget this many steps in, then every BUDGET_REFIT_EVERY: the pace keeps settling. A
# step keeps getting faster well past step 200, so a run fitted only up to there stopped early and left
# part of its budget unused (docs/results/2026-12-02-h200-recipe).
BUDGET_REFITS = (10, 50, 200)
BUDGET_REFIT_EVERY = 200


def budget_refits(step: int, cap: int) -> list[int]:
    """The steps after which the time budget's fit is refined (a run resumed at `step` starts anew)."""
    first = [step + n for n in BUDGET_REFITS]
    return [s for s in first + list(range(first[-1] + BUDGET_REFIT_EVERY, cap, BUDGET_REFIT_EVERY)) if s < cap]


def train(cfg: TrainConfig) -> dict:
    """Train a draft; returns the final manifest (empty on ranks other than 0)."""
    with run_folder(cfg), plan_free_attention():
        return Trainer(cfg).fit()


@contextlib.contextmanager
def run_folder(cfg: TrainConfig):
    """Rank 0 holds --out's writer lock for the whole run, so a second run into it is refused instead
    of mixing weights, manifest, trainer state and log; --overwrite empties it under the lock."""
    if int(os.environ.get("RANK", "0")) != 0:  # the other DDP ranks write nothing of their own
        yield
        return
    with writer_lock(cfg.out, stage="train"):
        if cfg.overwrite:
            clear_folder(cfg.out)
        yield
