"""`TrainConfig`: every setting of a training run, resolved, recorded in the manifest and the resume
state, and declared once: its fields generate `eaglekit train`'s flags (eaglekit.options)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from eaglekit.draft.config import DRAFT_VOCAB_SIZE
from eaglekit.errors import EaglekitError
from eaglekit.options import int_tuple, option
from eaglekit.targets.options import DEFAULT_TARGET, TARGET_HELP

# Settings that may differ between a run and its resumption without changing a single number, or
# (the kernel choices: ttt_attention, soft_ce, compile) only by float rounding; a state written before they
# existed still resumes. cache_target is one of them: the cached passes train on the target's own states
# (bit-identical on CPU; on a GPU a conversation's states may round differently in another batch's shapes).
RESUME_FREE = (
    "resume",
    "overwrite",
    "progress",
    "out",
    "ttt_attention",
    "soft_ce",
    "compile",
    "cache_target",
    "profile_steps",
)
ATTENTIONS = ("merged", "dense")  # train/attention.py implements them
SOFT_CES = ("plain", "fused", "compiled")  # train/loss.py
OBJECTIVES = ("soft-ce", "lk-alpha", "lk-hybrid")  # train/loss.py
SCHEDULES = ("cosine", "linear", "constant")  # train/optim.py
OPTIMIZERS = ("adamw", "muon")  # train/optim.py


def profile_window(text: str) -> tuple[int, int]:
    """--profile-steps A:B -> (A, B): the steps after step A up to step B are traced."""
    try:
        first, last = (int(x) for x in text.split(":"))
    except ValueError:
        first = last = -1
    if not 0 <= first < last:
        raise EaglekitError(f"--profile-steps {text!r} is not A:B with 0 <= A < B", hint="e.g. --profile-steps 300:320")
    return first, last


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Every setting of a training run; the `option` fields are also `eaglekit train`'s flags (train/cli.py)."""

    # inputs
    target: str = option(help=TARGET_HELP, group="inputs", cli_default=DEFAULT_TARGET)
    features: str | None = option(None, "offline: feature folder from `eaglekit features`", group="inputs")
    data: str | None = option(None, "online: conversations folder or .jsonl (target runs per batch)", group="inputs")
    val_data: str | None = option(None, "held-out conversations (online) or features (offline)", group="inputs")
    val_fraction: float = option(
        0.05,
        "else hold out this share, split by id (and every conversation "
        "labelled `split: validation`: the prompts' own held-out share)",
        group="inputs",
    )
    val_max_samples: int | None = option(None, "validate on at most this many samples", group="inputs")
    train_fraction: float = option(
        1.0,
        "train on this hash-stable share of the training samples (a smaller share "
        "is a subset of a larger one; validation is unchanged): the slices of a "
        "data-scaling curve",
        group="inputs",
    )
    allow_partial_features: bool = option(
        False, "train on the finished shards of a capture that is still running", group="inputs"
    )
    out: str = option(help="output folder (the draft checkpoint + trainer state)", group="inputs", required=True)
    # draft
    vocab: str | None = option(
        None, "vocab.safetensors or folder from `eaglekit vocab` (default: built from the data)", group="draft"
    )
    init_from: str | None = option(
        None, "start from this native draft (weights and vocab); with --max-steps 0 only validate it", group="draft"
    )
    allow_unfinished: bool = option(
        False, "--init-from a draft whose training did not finish (refused otherwise)", group="draft"
    )
    draft_vocab_size: int = option(DRAFT_VOCAB_SIZE, "rows of the draft lm_head", group="draft")
    allow_smaller_vocab: bool = option(
        False, "if the data has fewer distinct tokens than --draft-vocab-size, keep them all", group="draft"
    )
    aux_layer_ids: tuple[int, ...] | None = option(
        None, "online: comma-separated target layers (offline: the features' ids)", group="draft", parse=int_tuple
    )
    target_device_map: str | None = option(
        None, "online, one process: shard a target too large for one GPU over all GPUs (e.g. auto)", group="draft"
    )
    lm_head_init: str = option(
        "target",
        "start lm_head from the target's rows of the draft vocab or randomly",
        group="draft",
        choices=("target", "random"),
    )
    freeze_lm_head: bool = option(
        False,
        "keep lm_head at the target's rows of the draft vocab (--lm-head-init target): not trained, "
        "not in the optimizer, still in the checkpoint",
        group="draft",
    )
    # EAGLE-3.1's layouts (SGLang's and vLLM's names; docs/contracts.md, "Draft layouts")
    fc_norm: bool = option(False, "an RMSNorm on each aux state before fc (EAGLE-3.1)", group="draft")
    norm_before_fc: bool = option(False, "one RMSNorm over the concatenated aux states before fc", group="draft")
    norm_output: bool = option(
        False, "each draft step reads the previous step's normed output (EAGLE-3.1)", group="draft"
    )
    # training
    ttt_steps: int = option(7, "unrolled draft steps", group="training")
    val_ttt_steps: int | None = option(
        None,
        "draft steps validation unrolls (default: --ttt-steps); more scores the draft at served chains "
        "longer than it trains, so drafts of different --ttt-steps compare at one chain length",
        group="training",
    )
    step_decay: float = option(0.8, "loss weight of step j is decay**j", group="training")
    max_length: int = option(2048, "online: truncate conversations", group="training")
    batch_tokens: int = option(8192, "rows x padded length per micro-batch", group="training")
    max_batch_size: int = option(64, "rows per micro-batch at most", group="training")
    grad_accum: int = option(1, "micro-batches per optimizer step and rank", group="training")
    epochs: float = option(1.0, "passes over the training samples", group="training")
    max_steps: int | None = option(None, "optimizer steps (overrides --epochs)", group="training")
    time_budget_s: float | None = option(
        None, "fit the run into this many seconds (stops, and sizes the schedule, to fit)", group="training"
    )
    lr: float = option(3e-4, "peak learning rate", group="training")
    min_lr_ratio: float = option(0.05, "final learning rate / peak", group="training")
    schedule: str = option("cosine", "learning-rate schedule", group="training", choices=SCHEDULES)
    warmup_steps: int | None = option(None, "default: 2%% of the steps", group="training")
    weight_decay: float = option(0.0, "AdamW weight decay", group="training")
    optimizer: str = option(
        "adamw",
        "adamw over every trained parameter, or muon: Muon over the weight matrices of fc and the draft "
        "layer, AdamW over the rest (lm_head, norms)",
        group="training",
        choices=OPTIMIZERS,
    )
    muon_lr: float | None = option(
        None,
        "--optimizer muon: the Muon matrices' peak learning rate, on the same schedule "
        "(updates scaled to AdamW's RMS, so it reads as --lr; default: --lr)",
        group="training",
    )
    muon_momentum: float = option(0.95, "--optimizer muon: Muon's momentum", group="training")
    # 0 as AdamW's --weight-decay, so --optimizer muon changes the optimizer alone (speculators uses 0.1)
    muon_weight_decay: float = option(0.0, "--optimizer muon: Muon's weight decay", group="training")
    betas: tuple[float, float] = (0.9, 0.95)
    max_grad_norm: float = option(0.5, "gradient clipping norm", group="training")
    seed: int = option(0, "seed of the initialization and the data order", group="training")
    device: str = option("auto", "auto, cpu, cuda", group="training")
    precision: str = option(
        "auto", "auto: bf16 autocast on GPU, fp32 on CPU", group="training", choices=("auto", "fp32", "bf16")
    )
    ttt_attention: str = option(
        "merged",
        "TTT attention: merged (causal flash kernel + each position's own chain; "
        "a faster step in less memory than dense: docs/notes/training.md) or dense "
        "(the reference formula, [L, L] scores per step)",
        group="training",
        choices=ATTENTIONS,
    )
    soft_ce: str = option(
        "plain",
        "the soft cross-entropy: plain (log-softmax, then the teacher's dot), fused "
        "(keeps no fp32 log-probs for the backward: less memory, a slower step) or "
        "compiled (the plain formula under torch.compile: one pass each way; not yet "
        "timed in the recipe's loop); figures: docs/notes/training.md",
        group="training",
        choices=SOFT_CES,
    )
    objective: str = option(
        "soft-ce",
        "what training minimizes: soft-ce (the soft cross-entropy against the target), lk-alpha "
        "(-log of the acceptance rate alpha = sum_v min(p, q)) or lk-hybrid (the soft CE and 1 - alpha, "
        "blended by alpha); what their A/Bs showed: docs/notes/training.md",
        group="training",
        choices=OBJECTIVES,
    )
    compile: bool = option(
        False,
        "torch.compile each TTT step's work, four graphs that every TTT step shares, and "
        "online the target's decoder layers, one graph for all (one process). The whole "
        "unroll compiled as one graph made the draft's part of a step much faster on a GPU, "
        "after a first step that took most of the recipe's time budget "
        "(docs/notes/training.md); off until the per-step graphs' compile is timed there",
        group="training",
    )
    cache_target: bool = option(
        False,
        "online, one process: keep the target's aux states and final hidden state of each conversation in "
        "host memory the first time the target runs on it, and read them back on later passes and "
        "validations instead of running the target again ((aux layers + 1) x hidden size x the target's "
        "dtype bytes a token; docs/notes/training.md)",
        group="training",
    )
    # reporting
    val_every: int = option(200, "validate every N steps (and at the end)", group="reporting")
    save_every: int = option(200, "write the resume state every N steps", group="reporting")
    log_every: int = option(10, "log every N steps", group="reporting")
    resume: bool = option(False, "continue the run in --out exactly where it stopped", group="reporting")
    overwrite: bool = option(False, "delete the run in --out and start over (under its writer lock)", group="reporting")
    progress: bool = option(True, "no progress bar", group="reporting")
    profile_steps: str | None = option(
        None,
        "trace optimizer steps A:B (e.g. 300:320) with torch.profiler and "
        "write profile.txt to --out: the ops by device and host time, the "
        "wall and device time a step",
        group="reporting",
    )
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if (self.features is None) == (self.data is None):
            raise EaglekitError(
                "pass exactly one of --features (offline) or --data (online)",
                hint="offline trains from `eaglekit features` output; online runs the target per batch",
            )
        if self.ttt_steps < 1:
            raise EaglekitError(f"ttt_steps {self.ttt_steps} < 1", hint="use e.g. --ttt-steps 7")
        if self.schedule not in SCHEDULES:
            raise EaglekitError(f"unknown schedule {self.schedule!r}", hint=f"use one of {SCHEDULES}")
        if self.lm_head_init not in ("target", "random"):
            raise EaglekitError(f"unknown lm_head init {self.lm_head_init!r}", hint="use target or random")
        if self.freeze_lm_head and self.lm_head_init != "target":
            raise EaglekitError(
                f"--freeze-lm-head keeps lm_head at the target's rows, and --lm-head-init {self.lm_head_init} "
                "starts it elsewhere",
                hint="drop --lm-head-init (target is the default), or drop --freeze-lm-head",
            )
        if self.val_ttt_steps is not None and self.val_ttt_steps < self.ttt_steps:
            raise EaglekitError(
                f"--val-ttt-steps {self.val_ttt_steps} would not score the draft's trained steps "
                f"(--ttt-steps {self.ttt_steps})",
                hint=f"use --val-ttt-steps {self.ttt_steps} or more, or drop it",
            )
        if self.optimizer not in OPTIMIZERS:
            raise EaglekitError(f"unknown optimizer {self.optimizer!r}", hint=f"use one of {OPTIMIZERS}")
        muon_set = [f.name for f in fields(self) if f.name.startswith("muon_") and getattr(self, f.name) != f.default]
        if self.optimizer != "muon" and muon_set:
            flags = " ".join(f"--{k.replace('_', '-')}" for k in muon_set)
            raise EaglekitError(
                f"{flags}: settings of Muon, and --optimizer is {self.optimizer}",
                hint=f"add --optimizer muon, or drop {flags}",
            )
        if self.ttt_attention not in ATTENTIONS:
            raise EaglekitError(f"unknown TTT attention {self.ttt_attention!r}", hint=f"use one of {ATTENTIONS}")
        if self.soft_ce not in SOFT_CES:
            raise EaglekitError(f"unknown soft CE {self.soft_ce!r}", hint=f"use one of {SOFT_CES}")
        if self.objective not in OBJECTIVES:
            raise EaglekitError(f"unknown objective {self.objective!r}", hint=f"use one of {OBJECTIVES}")
        if self.objective != "soft-ce" and self.soft_ce != "plain":
            raise EaglekitError(
                f"--soft-ce {self.soft_ce} is a kernel of the soft-ce objective; --objective {self.objective} "
                "runs its own formula (eagerly, or traced by --compile)",
                hint=f"drop --soft-ce {self.soft_ce}, or use --objective soft-ce",
            )
        if self.compile and self.soft_ce != "plain":
            raise EaglekitError(
                "--compile runs the plain soft CE (inductor fuses it itself)",
                hint=f"drop --soft-ce {self.soft_ce}, or drop --compile",
            )
        if self.cache_target and not self.online:
            raise EaglekitError(
                "--cache-target keeps the online target's states, and --features trains from a store already",
                hint="drop --cache-target, or train online with --data",
            )
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
        if self.profile_steps is not None:
            profile_window(self.profile_steps)
        if self.grad_accum < 1 or self.batch_tokens < 2 or self.max_length < 2:
            raise EaglekitError("grad_accum, batch_tokens and max_length must be positive", hint="check the arguments")

    @property
    def online(self) -> bool:
        return self.data is not None

    @property
    def muon_peak_lr(self) -> float:
        return self.lr if self.muon_lr is None else self.muon_lr

    def step_weights(self, steps: int | None = None) -> list[float]:
        """The loss weight decay**j of each step j (of `steps`, default --ttt-steps)."""
        return [self.step_decay**j for j in range(self.ttt_steps if steps is None else steps)]

    @property
    def val_steps(self) -> int:
        """The draft steps validation unrolls: the served chains it predicts go up to this length."""
        return self.ttt_steps if self.val_ttt_steps is None else self.val_ttt_steps

    def to_dict(self) -> dict:
        d = asdict(self)
        d["aux_layer_ids"] = list(self.aux_layer_ids) if self.aux_layer_ids is not None else None
        d["betas"] = list(self.betas)
        return d

    def resume_key(self) -> dict:
        key = {k: v for k, v in self.to_dict().items() if k not in RESUME_FREE}
        # Settings added since states were first written, left out at the values those states trained
        # with (the Muon settings mean nothing under adamw), so such states still resume.
        if key["objective"] == "soft-ce":
            del key["objective"]
        if key["optimizer"] == "adamw":
            for k in [k for k in key if k == "optimizer" or k.startswith("muon_")]:
                del key[k]
        if not key["freeze_lm_head"]:
            del key["freeze_lm_head"]
        if key["val_ttt_steps"] is None:
            del key["val_ttt_steps"]
        return key


CONFIG_FIELDS = tuple(f.name for f in fields(TrainConfig))
