"""What export, import and the doctor need to know about a target: config and tokenizer, no weights."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from eaglekit.targets.info import load_config
from eaglekit.targets.load import generation_eos_ids, load_tokenizer, target_fingerprint, text_config
from eaglekit.targets.source import TargetSource, resolve_target


@dataclass
class TargetFacts:
    source: TargetSource
    full_config: object
    tokenizer: object

    @property
    def config(self):
        """The decoder's (text) config."""
        return text_config(self.full_config)

    @cached_property
    def fingerprint(self) -> dict:
        return target_fingerprint(self.full_config, self.tokenizer, self.source)

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def architecture(self) -> str:
        return self.fingerprint["architecture"]

    @property
    def path(self) -> str:
        return str(self.source.path.resolve())


def target_facts(spec: str | TargetSource) -> TargetFacts:
    source = spec if isinstance(spec, TargetSource) else resolve_target(spec)
    config = load_config(source)
    return TargetFacts(
        source=source, full_config=config, tokenizer=load_tokenizer(source, generation_eos_ids(source, config))
    )
