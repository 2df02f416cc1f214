"""The doctor's static checks: small functions, one id each, reading a folder as one engine would.

Every check returns one `Check` with status "pass", "warn" or "fail", a message saying what was
found and a hint saying how to fix it. A defect is reported by exactly one check, so the report
names the cause and not its consequences.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from eaglekit.draft.config import DraftConfig
from eaglekit.draft.vocab import d2t_problems
from eaglekit.formats.base import EngineReading, Format
from eaglekit.formats.detect import Interpretation, rope_parameters
from eaglekit.formats.facts import TargetFacts
from eaglekit.formats.names import LAYER_ALIASES, NATIVE_LAYER, implied_layout, native_name
from eaglekit.formats.registry import FORMATS, aux_configurable

PASS, WARN, FAIL = "pass", "warn", "fail"


@dataclass
class Check:
    id: str
    status: str
    message: str
    hint: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Context:
    """Everything a check may look at."""

    interp: Interpretation  # the folder as its producer meant it
    reading: EngineReading  # the folder as the chosen engine reads it
    facts: TargetFacts  # the target's config and tokenizer
    target_embedding: Callable[[], torch.Tensor]  # loads the target's input embedding on demand
    cache: dict = field(default_factory=dict)

    @property
    def engine(self) -> str:
        return self.reading.engine

    @property
    def format(self) -> Format:
        """The format of the engine the folder is read by."""
        return FORMATS[self.reading.engine]


def check_config(ctx: Context) -> Check:
    problems = list(ctx.reading.problems)
    layers = ctx.reading.config.get("num_hidden_layers", 1)
    if layers != 1:
        problems.append(
            (
                FAIL,
                f"num_hidden_layers={layers}: eaglekit checks single-layer EAGLE-3 drafts",
                "multi-layer drafts are not supported",
            )
        )
    fails = [p for p in problems if p[0] == FAIL]
    worst = fails or [p for p in problems if p[0] == WARN]
    if not worst:
        return Check("config", PASS, f"{ctx.engine} reads the config ({ctx.interp.label})")
    return Check("config", worst[0][0], "; ".join(p[1] for p in worst), "; ".join(p[2] for p in worst))


def check_names(ctx: Context) -> Check:
    r, fmt = ctx.reading, ctx.format
    parts, hints = [], []
    if r.dropped:
        parts += (
            fmt.drops(r.dropped)
            if fmt.drops
            else [f"{ctx.engine} silently drops {len(r.dropped)} tensors ({', '.join(r.dropped[:4])})"]
        )
    if r.refused:
        parts.append(f"{ctx.engine} refuses to load {len(r.refused)} tensors ({', '.join(r.refused[:4])})")
    missing = list(r.missing)
    if fmt.without_lm_head and "lm_head.weight" in missing:
        missing.remove("lm_head.weight")
        parts.append(fmt.without_lm_head)
    if missing:
        parts.append(
            f"{len(missing)} parameters keep their init values{fmt.missing_where(r.dropped)} ({', '.join(missing[:4])})"
        )
    if not parts:
        return Check("names", PASS, f"{ctx.engine} loads all {len(r.loads)} tensors by name")
    if ctx.interp.layer_style in LAYER_ALIASES and ctx.interp.layer_style != fmt.layer_prefix and fmt.rename_layers:
        hints.append(fmt.rename_layers)
    if any(n.startswith("model.") for n in r.refused):
        hints.append("drop the `model.` prefix from tensor names")
    unbuilt = implied_layout({native_name(n)[0] for n in r.dropped + r.refused})
    if any(unbuilt.values()):  # the weights are there; the config does not ask for the norms they fill
        flags = ", ".join(f"{flag}: true" for flag, on in unbuilt.items() if on)
        hints.append(f"write {flags} in config.json: the folder holds their weights")
    hints.append(f"`eaglekit export --format {ctx.engine}` writes the names {ctx.engine} loads")
    return Check("names", FAIL, "; ".join(parts), "; ".join(hints))


def expected_shapes(ctx: Context) -> dict[str, tuple[int, ...]]:
    cfg = ctx.interp.config
    H, I, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    num_aux = ctx.format.fc_inputs(ctx.reading.config)
    L = NATIVE_LAYER
    return {
        "fc.weight": (H, num_aux * cfg.target_hidden_size),
        L + "self_attn.q_proj.weight": (cfg.num_attention_heads * hd, 2 * H),
        L + "self_attn.k_proj.weight": (cfg.num_key_value_heads * hd, 2 * H),
        L + "self_attn.v_proj.weight": (cfg.num_key_value_heads * hd, 2 * H),
        L + "self_attn.o_proj.weight": (H, cfg.num_attention_heads * hd),
        L + "mlp.gate_proj.weight": (I, H),
        L + "mlp.up_proj.weight": (I, H),
        L + "mlp.down_proj.weight": (H, I),
        L + "input_layernorm.weight": (H,),
        L + "hidden_norm.weight": (H,),
        L + "post_attention_layernorm.weight": (H,),
        "norm.weight": (H,),
        "input_norm.weight": (num_aux * cfg.target_hidden_size,),
        **{f"fc_norm.{i}.weight": (cfg.target_hidden_size,) for i in range(num_aux)},
    }


def check_shapes(ctx: Context) -> Check:
    native = ctx.interp.native
    bad = [
        f"{name} is {tuple(native[name].shape)}, expected {shape}"
        for name, shape in expected_shapes(ctx).items()
        if name in native and tuple(native[name].shape) != shape
    ]
    head = native.get("lm_head.weight")
    if head is not None and head.shape[-1] != ctx.interp.config.hidden_size:
        bad.append(f"lm_head.weight has {head.shape[-1]} columns, expected hidden {ctx.interp.config.hidden_size}")
    if not bad:
        cfg = ctx.interp.config
        return Check(
            "shapes",
            PASS,
            f"q/k/v read 2H={2 * cfg.hidden_size}; fc reads "
            f"{expected_shapes(ctx)['fc.weight'][1]} = aux layers x target hidden",
        )
    return Check(
        "shapes",
        FAIL,
        "; ".join(bad[:4]),
        "the config and the weights disagree: fc must read len(aux_layer_ids) x target hidden, "
        "q/k/v read cat(embedding, hidden) = 2H",
    )


def check_draft_vocab_size(ctx: Context) -> Check:
    declared = ctx.interp.flat.get("draft_vocab_size")
    head = ctx.interp.native.get("lm_head.weight")
    if declared is None:
        effect = ctx.format.without_draft_vocab_size
        return Check(
            "draft_vocab_size",
            FAIL,
            f"config.json has no draft_vocab_size: {effect}",
            f"write draft_vocab_size = {head.shape[0] if head is not None else 'lm_head rows'}",
        )
    if head is not None and head.shape[0] != declared:
        return Check(
            "draft_vocab_size",
            FAIL,
            f"draft_vocab_size {declared} but lm_head has {head.shape[0]} rows",
            "write the lm_head's row count as draft_vocab_size",
        )
    return Check("draft_vocab_size", PASS, f"draft_vocab_size {declared} = lm_head rows")


def check_d2t(ctx: Context) -> Check:
    cfg, native = ctx.interp.config, ctx.interp.native
    if "d2t" not in native:
        if cfg.draft_vocab_size == cfg.vocab_size:
            return Check("d2t", PASS, "no d2t: draft and target vocab are equal (identity map)")
        return Check(
            "d2t",
            FAIL,
            f"no d2t for a draft vocab of {cfg.draft_vocab_size} < {cfg.vocab_size}: "
            "engines map draft ids to the first target ids",
            "ship d2t (int64 offsets) with the weights",
        )
    problems, hint = d2t_problems(native["d2t"], native.get("t2d"), cfg.draft_vocab_size, ctx.facts.vocab_size)
    if problems:
        return Check("d2t", FAIL, "; ".join(problems), hint)
    return Check(
        "d2t",
        PASS,
        f"d2t holds offsets to {cfg.draft_vocab_size} strictly increasing target ids"
        + ("" if "t2d" in native else " (no t2d: engines do not need it)"),
    )


def check_hidden_size(ctx: Context) -> Check:
    cfg, H = ctx.interp.config, ctx.facts.hidden_size
    bad = []
    if cfg.target_hidden_size != H:
        bad.append(f"target_hidden_size {cfg.target_hidden_size} != the target's hidden size {H}")
    if cfg.hidden_size != H and ctx.reading.embedding == "target":
        bad.append(
            f"draft hidden {cfg.hidden_size} != target hidden {H}, but {ctx.engine} feeds the draft "
            "the target's embedding"
        )
    if bad:
        return Check("hidden_size", FAIL, "; ".join(bad), "train the draft for this target (hidden sizes must match)")
    return Check("hidden_size", PASS, f"draft and target hidden size {H}")


def check_embedding(ctx: Context) -> Check:
    shipped, uses = ctx.interp.embed, ctx.reading.embedding
    if shipped is None:
        if uses == "draft":
            return Check(
                "embedding",
                FAIL,
                f"{ctx.engine} uses the draft's own embedding (the config sets "
                "target_hidden_size) but the folder has none: it stays random",
                "remove target_hidden_size from the config, or ship the target's embedding",
            )
        return Check("embedding", PASS, f"{ctx.engine} uses the target's embedding")
    target = ctx.target_embedding()
    if tuple(shipped.shape) != tuple(target.shape):
        same = False
    else:
        same = bool(
            torch.equal(shipped.to(target.dtype), target) or torch.equal(shipped, target.to(shipped.dtype))
        )  # equal up to the export dtype
    if same:
        return Check("embedding", PASS, "the shipped embedding is the target's")
    if uses == "draft":
        return Check(
            "embedding",
            FAIL,
            f"{ctx.engine} uses the draft's shipped embedding, which differs from "
            "the target's the draft was trained with",
            "remove embed_tokens.weight from the folder",
        )
    return Check(
        "embedding",
        WARN,
        f"the shipped embedding differs from the target's; {ctx.engine} ignores it and uses the target's",
        "if the draft was trained with its own embedding, serve it in vLLM",
    )


def check_rope(ctx: Context) -> Check:
    draft = ctx.interp.config
    expected = DraftConfig.for_target(
        ctx.facts.config,
        aux_layer_ids=list(draft.aux_layer_ids),
        draft_vocab_size=min(draft.draft_vocab_size, ctx.facts.vocab_size),
    )
    mine, theirs = rope_parameters(ctx.reading.config), expected.rope_parameters
    bad = [
        f"{k} {mine.get(k)} != target's {theirs.get(k)}"
        for k in sorted(set(mine) | set(theirs))
        if k != "original_max_position_embeddings" and mine.get(k) != theirs.get(k)
    ]
    target_max = getattr(ctx.facts.config, "max_position_embeddings", None) or 0
    max_pos = ctx.reading.config.get("max_position_embeddings") or 0
    if max_pos < target_max:
        bad.append(f"max_position_embeddings {max_pos} < the target's {target_max}")
    if bad:
        return Check(
            "rope",
            FAIL,
            "; ".join(bad),
            "copy the target's rope settings and max_position_embeddings "
            "into the draft config (the draft rotates positions like the target)",
        )
    return Check("rope", PASS, f"rope {mine.get('rope_type')} theta {mine.get('rope_theta')}, max positions {max_pos}")


def check_aux_layer_ids(ctx: Context) -> Check:
    r, meant = ctx.reading, list(ctx.interp.config.aux_layer_ids)
    N = ctx.facts.num_layers
    if r.aux_layer_ids is None:
        return Check("aux_layer_ids", WARN, "the target's layer count is unknown", "pass --target")
    manifest = ctx.interp.folder.manifest or {}
    recorded = next(
        (
            b["aux_layer_ids"]
            for b in (manifest, manifest.get("source_manifest") or {})  # training's
            if isinstance(b, dict) and b.get("stage") == "train" and isinstance(b.get("aux_layer_ids"), list)
        ),
        None,
    )
    if recorded is not None and list(recorded) != meant:
        return Check(
            "aux_layer_ids",
            FAIL,
            f"the folder's manifest says training ran on aux layers {list(recorded)}, "
            f"its config says {meant}: the two come from different runs",
            "export the draft again from its training run folder",
        )
    out_of_range = [i for i in meant if not 0 <= i < N]
    if out_of_range:
        return Check(
            "aux_layer_ids",
            FAIL,
            f"aux layers {out_of_range} do not exist in a {N}-layer target",
            "the draft was made for another target",
        )
    fmt = ctx.format
    write = (
        f"{fmt.aux_field} = {fmt.engine_ids(meant)}"
        if fmt.aux_field
        else f"nothing: {fmt.title}'s layers are hard-coded; retrain on them or serve in {aux_configurable()}"
    )
    if sorted(meant) == list(r.aux_layer_ids) and meant != list(r.aux_layer_ids):
        return Check(
            "aux_layer_ids",
            FAIL,
            f"the draft was trained on aux layers in the order {meant}, but "
            f"{ctx.engine} concatenates them in layer order {r.aux_layer_ids}: fc reads them permuted",
            "permute fc's input blocks into layer order, or retrain with sorted aux_layer_ids",
        )
    if list(r.aux_layer_ids) != meant:
        return Check(
            "aux_layer_ids",
            FAIL,
            f"{ctx.engine} captures the outputs of layers {r.aux_layer_ids} "
            f"({r.aux_source}), the draft was trained on {meant} ({ctx.interp.aux_source})",
            f"write {write}",
        )
    if r.aux_alternative is not None and list(r.aux_alternative) != meant:
        return Check(
            "aux_layer_ids",
            WARN,
            f"{ctx.engine} captures {meant} in the version modelled, but other "
            f"versions capture {r.aux_alternative} ({r.aux_source})",
            f"write {write}",
        )
    if fmt.older_miss_last_layer and N - 1 in meant:
        return Check(
            "aux_layer_ids",
            WARN,
            f"the last layer's output is an aux state: older {fmt.title} cannot capture it",
            f"check the {fmt.title} version",
        )
    return Check("aux_layer_ids", PASS, f"{ctx.engine} captures the outputs of layers {meant} ({r.aux_source})")


def check_aux_states(ctx: Context) -> Check:
    cfg = ctx.interp.config
    if not ctx.reading.use_aux:
        return Check(
            "aux_states",
            FAIL,
            f"eagle_config.use_aux_hidden_state is false: {ctx.engine} feeds the "
            f"draft one final hidden state ({ctx.facts.hidden_size} wide) instead of {cfg.num_aux} aux "
            f"states concatenated ({cfg.fused_width} wide) and skips fc",
            "set use_aux_hidden_state to true",
        )
    if ctx.format.fc_only_if_widths_differ and cfg.fused_width == cfg.hidden_size:
        return Check(
            "aux_states",
            FAIL,
            f"the fused width {cfg.fused_width} equals the draft hidden size: "
            f"{ctx.engine} applies fc only when the widths differ, so fc is skipped",
            "use more aux layers (EAGLE-3 uses three)",
        )
    return Check(
        "aux_states",
        PASS,
        f"{ctx.engine} feeds {cfg.num_aux} aux states x {cfg.target_hidden_size} = {cfg.fused_width} wide into fc",
    )


def check_vocab(ctx: Context) -> Check:
    cfg, V = ctx.interp.config, ctx.facts.vocab_size
    if cfg.vocab_size != V:
        return Check(
            "vocab",
            FAIL,
            f"draft vocab_size {cfg.vocab_size} != the target's {V}",
            "the draft was made for another tokenizer",
        )
    recorded = ctx.interp.folder.recorded_target
    mine = ctx.facts.fingerprint["tokenizer_hash"]
    if recorded and recorded.get("tokenizer_hash") not in (None, mine):
        return Check(
            "vocab",
            FAIL,
            f"the draft was trained with another tokenizer or chat template "
            f"({recorded.get('tokenizer_hash')} != {mine})",
            "train the draft with this target's tokenizer",
        )
    return Check("vocab", PASS, f"vocab size {V}" + (", same tokenizer and chat template" if recorded else ""))


def check_target(ctx: Context) -> Check:
    recorded = ctx.interp.folder.recorded_target
    if not recorded:
        return Check(
            "target",
            WARN,
            "no target recorded (a third-party draft?): which model it was made for "
            "cannot be checked, only its shapes and vocab size",
            "if you know the target: `eaglekit import DRAFT --target T --out DIR` records it",
        )
    mine = ctx.facts.fingerprint
    if recorded.get("config_hash") != mine["config_hash"]:
        return Check(
            "target",
            FAIL,
            f"the draft was made for another target ({recorded.get('name')!r}, "
            f"config {recorded.get('config_hash')} != {mine['config_hash']})",
            "pass the target it was trained for",
        )
    if recorded.get("weights_hash") is None:
        return Check(
            "target",
            WARN,
            f"made for a target with this config ({recorded.get('name')}); its weights "
            "were not recorded (an older eaglekit), so a fine-tune of the same model passes too",
            "retrain, or export again with a current eaglekit, to record them",
        )
    if recorded["weights_hash"] != mine["weights_hash"]:
        return Check(
            "target",
            FAIL,
            f"the draft was made for other weights of this architecture "
            f"({recorded.get('name')!r}, weights {recorded['weights_hash']} != {mine['weights_hash']}): "
            "a fine-tune or another checkpoint of the model",
            "pass the target it was trained for",
        )
    return Check("target", PASS, f"made for this target ({recorded.get('name')}, same config and weights)")


def check_weights(ctx: Context) -> Check:
    bad = [n for n, t in ctx.interp.native.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        return Check(
            "weights",
            FAIL,
            f"non-finite values in {', '.join(bad[:4])}",
            "the checkpoint is corrupt; take an earlier one",
        )
    zero = [n for n, t in ctx.interp.native.items() if t.is_floating_point() and not bool(t.any())]
    if zero:
        return Check("weights", WARN, f"all-zero tensors: {', '.join(zero[:4])}", "is the checkpoint complete?")
    return Check("weights", PASS, "all weights finite")


CHECKS: tuple[Callable[[Context], Check], ...] = (
    check_config,
    check_names,
    check_shapes,
    check_draft_vocab_size,
    check_d2t,
    check_hidden_size,
    check_embedding,
    check_rope,
    check_aux_layer_ids,
    check_aux_states,
    check_vocab,
    check_target,
    check_weights,
)


def run_checks(ctx: Context) -> list[Check]:
    return [check(ctx) for check in CHECKS]
