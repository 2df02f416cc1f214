"""Everything a run needs before its first step: target parts, feature sources, vocab, the draft."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from eaglekit.artifacts import hash_share, refuse_unfinished
from eaglekit.draft.checkpoint import load_draft
from eaglekit.draft.config import LAYOUT_KEYS, DraftConfig
from eaglekit.draft.model import Eagle3Draft
from eaglekit.draft.vocab import DraftVocab, build_draft_vocab, count_assistant_tokens
from eaglekit.errors import EaglekitError
from eaglekit.features.conversations import is_validation, read_conversations, tokenize_conversations
from eaglekit.features.store import FeatureStore
from eaglekit.formats.folder import read_folder
from eaglekit.targets.aux import check_aux_layer_ids, default_aux_layer_ids
from eaglekit.targets.load import load_target
from eaglekit.train.baselines import baseline_accuracy
from eaglekit.train.config import TrainConfig
from eaglekit.train.distributed import Dist
from eaglekit.train.sources import OfflineSource, OnlineSource, validation_workload
from eaglekit.train.target_parts import TargetParts, load_target_parts

log = logging.getLogger(__name__)


@dataclass
class Run:
    fingerprint: dict
    aux_layer_ids: list[int]
    vocab: DraftVocab
    draft: Eagle3Draft
    train: OfflineSource | OnlineSource
    val: OfflineSource | OnlineSource | None
    inputs: dict = field(default_factory=dict)
    counts: dict = field(default_factory=dict)


def split_members(ids: list[str], fraction: float, held_out: set[str] = frozenset()) -> tuple[list[int], list[int]]:
    """(train, validation) indices: validation is the hash share `fraction` of the ids plus every id
    labelled held out upstream (the prompts' own validation split, which is never trained on)."""
    train, val = [], []
    for i, sid in enumerate(ids):
        (val if sid in held_out or is_validation(sid, fraction) else train).append(i)
    return train, val


def in_train_share(sample_id: str, fraction: float) -> bool:
    """`--train-fraction`: whether a sample is in the hash-stable share `fraction` of the training
    data. The hash is salted, so the share is independent of the validation split, and a smaller
    share is a subset of a larger one (the nested slices of a data-scaling curve)."""
    return fraction >= 1 or hash_share("eaglekit-train-share:" + sample_id, fraction)


def train_share(ids: list[str], members: list[int], fraction: float) -> list[int]:
    """The members (indices into `ids`) inside the `--train-fraction` share."""
    kept = [i for i in members if in_train_share(ids[i], fraction)]
    if not kept:
        raise EaglekitError(
            f"--train-fraction {fraction} keeps none of the {len(members)} training samples",
            hint="use a larger fraction or more data",
        )
    return kept


def counting_masks(pairs, tally: dict):
    """Pass (input_ids, loss_mask) pairs through, adding their assistant tokens to tally["assistant_tokens"]."""
    for ids, mask in pairs:
        tally["assistant_tokens"] += int(torch.as_tensor(mask).sum())
        yield ids, mask


def initial_draft(cfg: TrainConfig) -> Eagle3Draft | None:
    """The `--init-from` draft (its weights and vocab start the run), read once; None without it."""
    if not cfg.init_from:
        return None
    if Path(cfg.init_from).is_dir():  # a killed run's checkpoint is not a draft to build on (--resume it)
        refuse_unfinished(read_folder(cfg.init_from).unfinished, cfg.init_from, allow_unfinished=cfg.allow_unfinished)
    return load_draft(cfg.init_from)


def choose_vocab(
    cfg: TrainConfig, token_masks, vocab_size: int, stop_ids: list[int], start: Eagle3Draft | None = None
) -> DraftVocab:
    if cfg.vocab or start is not None:
        if start is not None:
            vocab = DraftVocab.from_d2t(start.d2t, start.t2d.numel())
        else:
            vocab = DraftVocab.load(cfg.vocab)
        source = cfg.init_from or cfg.vocab
        if vocab.vocab_size != vocab_size:
            raise EaglekitError(
                f"vocab of {source} is for a {vocab.vocab_size}-token vocabulary, the target has {vocab_size}",
                hint="build the vocab with this target",
            )
        counts = count_assistant_tokens(token_masks, vocab_size)
        vocab.coverage = vocab.coverage_of(counts)
        return vocab
    counts = count_assistant_tokens(token_masks, vocab_size)
    return build_draft_vocab(
        counts, cfg.draft_vocab_size, always_include=stop_ids, allow_smaller=cfg.allow_smaller_vocab
    )


def build_draft(
    cfg: TrainConfig,
    target_config,
    aux_layer_ids: list[int],
    vocab: DraftVocab,
    embedding: torch.Tensor,
    lm_head: torch.Tensor | None,
    start: Eagle3Draft | None = None,
) -> Eagle3Draft:
    """A freshly initialized draft (seeded) with the target's frozen embedding and the vocab's maps;
    with `start` (the `--init-from` draft) its weights are loaded on top."""
    layout = {key: getattr(cfg, key) for key in LAYOUT_KEYS}
    if start is not None and not any(layout.values()):  # --init-from keeps the draft's layout unless told one
        layout = start.config.layout()
        if any(layout.values()):
            log.info("--init-from %s: its layout %s carries on", cfg.init_from, layout)
    dcfg = replace(
        DraftConfig.for_target(target_config, aux_layer_ids=aux_layer_ids, draft_vocab_size=vocab.size), **layout
    )
    torch.manual_seed(cfg.seed)
    draft = Eagle3Draft(dcfg)
    draft.set_target_embedding(embedding)
    vocab.apply_to(draft)
    if cfg.lm_head_init == "target":
        if lm_head is None:
            raise EaglekitError(
                "the target has no output embedding to initialize the draft's lm_head from",
                hint="pass --lm-head-init random",
            )
        with torch.no_grad():
            draft.lm_head.weight.copy_(lm_head[vocab.draft_ids].to(draft.lm_head.weight.dtype))
    if start is not None:
        if start.config != dcfg:
            diff = [k for k, v in start.config.to_dict().items() if dcfg.to_dict().get(k) != v]
            flags = " ".join(f"--{k.replace('_', '-')}" for k in LAYOUT_KEYS if getattr(start.config, k))
            raise EaglekitError(
                f"--init-from {cfg.init_from} is a draft of another shape ({diff})",
                hint="start from a draft made for this target and these aux layers"
                + (f", in its layout ({flags or 'no layout flags'})" if set(diff) & set(LAYOUT_KEYS) else ""),
            )
        target_rows = draft.lm_head.weight.detach().clone()
        draft.load_state_dict(start.draft_state_dict(), strict=False)
        if cfg.freeze_lm_head and not torch.equal(draft.lm_head.weight, target_rows):
            raise EaglekitError(
                f"--freeze-lm-head keeps lm_head at the target's rows, and the lm_head of --init-from "
                f"{cfg.init_from} was trained away from them",
                hint="drop --freeze-lm-head to train on from its lm_head, or start from a draft trained with it",
            )
    if cfg.freeze_lm_head:  # neither trained nor in the optimizer; saved all the same (exports need it)
        draft.lm_head.weight.requires_grad_(False)
    return draft


def prepare_online(cfg: TrainConfig, dist: Dist) -> Run:
    if cfg.target_device_map and dist.enabled:
        raise EaglekitError(
            "--target-device-map shards the target over all GPUs and cannot run under torchrun",
            hint="capture features offline (`eaglekit features --device-map auto`) and train DDP from them",
        )
    target = load_target(cfg.target, device=str(dist.device), dtype="auto", device_map=cfg.target_device_map)
    tcfg = target.config
    aux = check_aux_layer_ids(
        list(cfg.aux_layer_ids or default_aux_layer_ids(tcfg.num_hidden_layers)), tcfg.num_hidden_layers
    )
    fp = target.fingerprint()
    rows, data_fp = read_conversations(cfg.data, target_fingerprint=fp)
    samples, counts = tokenize_conversations(target.tokenizer, rows, max_length=cfg.max_length)
    if cfg.val_data:
        val_rows, val_fp = read_conversations(cfg.val_data, target_fingerprint=fp)
        val_samples, _ = tokenize_conversations(target.tokenizer, val_rows, max_length=cfg.max_length)
        train_samples = [s for s in samples if not s.held_out]  # held out upstream: never trained on
    else:
        val_fp = None
        t_idx, v_idx = split_members([s.id for s in samples], cfg.val_fraction, {s.id for s in samples if s.held_out})
        train_samples, val_samples = [samples[i] for i in t_idx], [samples[i] for i in v_idx]
    if not train_samples:
        raise EaglekitError("no training conversations left after the validation split", hint="add data")
    if cfg.train_fraction < 1:
        train_samples = [
            train_samples[i]
            for i in train_share([s.id for s in train_samples], list(range(len(train_samples))), cfg.train_fraction)
        ]
    start = initial_draft(cfg)
    vocab = choose_vocab(
        cfg, ((s.input_ids, s.loss_mask) for s in train_samples), tcfg.vocab_size, target.stop_token_ids, start
    )
    emb = target.model.get_input_embeddings().weight.detach().float().cpu()
    head = target.model.get_output_embeddings()
    draft = build_draft(
        cfg,
        target.model.config,
        aux,
        vocab,
        emb,
        head.weight.detach().float().cpu() if head is not None else None,
        start,
    )
    train = OnlineSource(target.model, train_samples, aux, vocab)
    val = OnlineSource(target.model, val_samples, aux, vocab) if val_samples else None
    counts.update(
        train_samples=len(train_samples),
        val_samples=len(val_samples),
        train_tokens=sum(s.length for s in train_samples),
        train_assistant_tokens=int(sum(int(s.loss_mask.sum()) for s in train_samples)),
    )
    return Run(fp, aux, vocab, draft, train, val, inputs={"data": data_fp, "val_data": val_fp}, counts=counts)


def prepare_offline(cfg: TrainConfig, dist: Dist) -> Run:
    parts: TargetParts = load_target_parts(cfg.target)
    tcfg = parts.text_config
    store = FeatureStore(
        cfg.features,
        target_fingerprint=parts.fingerprint,
        hidden_size=tcfg.hidden_size,
        allow_partial=cfg.allow_partial_features,
    )
    aux = check_aux_layer_ids(store.aux_layer_ids, tcfg.num_hidden_layers)
    if cfg.aux_layer_ids is not None and list(cfg.aux_layer_ids) != aux:
        raise EaglekitError(
            f"--aux-layer-ids {list(cfg.aux_layer_ids)} but the features hold layers {aux}",
            hint="drop --aux-layer-ids, or capture features with those layers",
        )
    if cfg.val_data:
        val_store = FeatureStore(
            cfg.val_data,
            target_fingerprint=parts.fingerprint,
            hidden_size=tcfg.hidden_size,
            allow_partial=cfg.allow_partial_features,
        )
        if val_store.aux_layer_ids != aux:
            raise EaglekitError(
                "validation features hold other aux layers than the training features",
                hint="capture both with the same --aux-layer-ids",
            )
        held_out = store.held_out  # held out upstream: never trained on
        t_idx, v_idx = [i for i, sid in enumerate(store.ids) if sid not in held_out], list(range(len(val_store)))
    else:
        val_store = store
        t_idx, v_idx = split_members(store.ids, cfg.val_fraction, store.held_out)
    if not t_idx:
        raise EaglekitError("no training samples left after the validation split", hint="add data")
    if cfg.train_fraction < 1:
        t_idx = train_share(store.ids, t_idx, cfg.train_fraction)
    train_set = set(t_idx)
    tally = {"assistant_tokens": 0}
    masks = counting_masks((tm for i, tm in enumerate(store.token_masks()) if i in train_set), tally)
    start = initial_draft(cfg)
    vocab = choose_vocab(cfg, masks, tcfg.vocab_size, parts.stop_token_ids, start)
    draft = build_draft(cfg, parts.config, aux, vocab, parts.embedding, parts.lm_head, start)
    train = OfflineSource(store, t_idx, vocab)
    val = OfflineSource(val_store, v_idx, vocab) if v_idx else None
    lengths = store.lengths
    counts = {
        "train_samples": len(t_idx),
        "val_samples": len(v_idx),
        "tokens": sum(lengths[i] for i in t_idx),
        "train_tokens": sum(lengths[i] for i in t_idx),
        "train_assistant_tokens": tally["assistant_tokens"],
    }
    inputs = {"features": store_fingerprint(store)}
    if val_store is not store:
        inputs["val_data"] = store_fingerprint(val_store)
    return Run(parts.fingerprint, aux, vocab, draft, train, val, inputs=inputs, counts=counts)


def store_fingerprint(store: FeatureStore) -> dict:
    return {
        "path": str(store.folder.resolve()),
        "counts": store.manifest.get("counts"),
        "created": store.manifest.get("created"),
        "complete": store.complete,
    }


def prepare(cfg: TrainConfig, dist: Dist) -> Run:
    run = prepare_online(cfg, dist) if cfg.online else prepare_offline(cfg, dist)
    if run.val is not None and cfg.val_max_samples is not None and len(run.val) > cfg.val_max_samples:
        keep = list(range(cfg.val_max_samples))
        if isinstance(run.val, OfflineSource):
            run.val = OfflineSource(run.val.store, [run.val.members[i] for i in keep], run.vocab)
        else:
            run.val = OnlineSource(run.val.model, [run.val.samples[i] for i in keep], run.aux_layer_ids, run.vocab)
    run.counts["draft_vocab_coverage"] = run.vocab.coverage
    run.counts["validation"] = validation_workload(cfg, run.val)  # the workload its prediction is for
    if run.val is not None:
        run.counts["val_baselines"] = baseline_accuracy(run.train.token_masks(), run.val.token_masks())
    log.info("draft vocab: %d ids, coverage %.4f of assistant tokens", run.vocab.size, run.vocab.coverage or 0)
    return run
