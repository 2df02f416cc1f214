"""`TrainConfig`: every setting of a training run, resolved, recorded in the manifest and the resume state."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from eaglekit.errors import EaglekitError
from eaglekit.train.optim import SCHEDULES

# Settings that may differ between a run and its resumption without changing a single number.
RESUME_FREE = ("resume", "overwrite", "progress", "out")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    target: str
    out: str
    features: str | None = None           # offline: an `eaglekit features` folder
    data: str | None = None               # online: a conversations folder / .jsonl
    val_data: str | None = None           # held-out conversations (online) or features (offline)
    val_fraction: float = 0.05            # else: this share of the samples, split by id hash
    train_fraction: float = 1.0           # train on this hash-stable share of the training samples (nested)
    allow_partial_features: bool = False
    vocab: str | None = None              # a vocab.safetensors (else built from the training split)
    init_from: str | None = None          # a native draft: its weights and vocab start the run (max_steps=0: validate it)
    draft_vocab_size: int = 32000
    allow_smaller_vocab: bool = False
    aux_layer_ids: tuple[int, ...] | None = None   # online only (offline: the features' ids)
    target_device_map: str | None = None  # online, one process: shard a large target over the GPUs ("auto")
    ttt_steps: int = 7
    step_decay: float = 0.8
    lm_head_init: str = "target"          # "target": the target's rows of the draft vocab; "random"
    max_length: int = 2048
    batch_tokens: int = 8192              # rows x padded length per micro-batch
    max_batch_size: int = 64
    grad_accum: int = 1
    epochs: float = 1.0
    max_steps: int | None = None          # overrides epochs
    time_budget_s: float | None = None    # stop (and size the schedule) to fit this wall-clock budget
    lr: float = 3e-4
    min_lr_ratio: float = 0.05
    schedule: str = "cosine"
    warmup_steps: int | None = None       # default: 2% of the steps
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    max_grad_norm: float = 0.5
    val_every: int = 200
    val_max_samples: int | None = None
    save_every: int = 200
    log_every: int = 10
    seed: int = 0
    device: str = "auto"                  # auto: cuda if available
    precision: str = "auto"               # auto: bf16 autocast on cuda, fp32 on cpu
    resume: bool = False
    overwrite: bool = False               # empty --out (under its writer lock) and start over
    progress: bool = True
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if (self.features is None) == (self.data is None):
            raise EaglekitError("pass exactly one of --features (offline) or --data (online)",
                                hint="offline trains from `eaglekit features` output; online runs the target per batch")
        if self.ttt_steps < 1:
            raise EaglekitError(f"ttt_steps {self.ttt_steps} < 1", hint="use e.g. --ttt-steps 7")
        if self.schedule not in SCHEDULES:
            raise EaglekitError(f"unknown schedule {self.schedule!r}", hint=f"use one of {SCHEDULES}")
        if self.lm_head_init not in ("target", "random"):
            raise EaglekitError(f"unknown lm_head init {self.lm_head_init!r}", hint="use target or random")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise EaglekitError(f"unknown precision {self.precision!r}", hint="use auto, fp32 or bf16")
        if not 0 <= self.val_fraction < 1:
            raise EaglekitError(f"val_fraction {self.val_fraction} must be in [0, 1)", hint="e.g. 0.05")
        if not 0 < self.train_fraction <= 1:
            raise EaglekitError(f"train_fraction {self.train_fraction} must be in (0, 1]", hint="e.g. 0.25")
        if self.resume and self.overwrite:
            raise EaglekitError("--resume continues the run in --out, --overwrite deletes it", hint="pass one of them")
        if self.init_from and self.vocab:
            raise EaglekitError("--init-from brings its own vocab; drop --vocab", hint="the draft's d2t is its vocab")
        if self.max_steps is not None and self.max_steps < 0:
            raise EaglekitError(f"max_steps {self.max_steps} < 0", hint="0 only validates --init-from")
        if self.grad_accum < 1 or self.batch_tokens < 2 or self.max_length < 2:
            raise EaglekitError("grad_accum, batch_tokens and max_length must be positive", hint="check the arguments")

    @property
    def online(self) -> bool:
        return self.data is not None

    def step_weights(self) -> list[float]:
        return [self.step_decay ** j for j in range(self.ttt_steps)]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["aux_layer_ids"] = list(self.aux_layer_ids) if self.aux_layer_ids is not None else None
        d["betas"] = list(self.betas)
        return d

    def resume_key(self) -> dict:
        return {k: v for k, v in self.to_dict().items() if k not in RESUME_FREE}


CONFIG_FIELDS = tuple(f.name for f in fields(TrainConfig))
