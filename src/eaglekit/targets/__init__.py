"""The target model: where it comes from, how it loads, its chat template and its aux states."""

from eaglekit.targets.capture import capture_aux_states, decoder_layers
from eaglekit.targets.info import TargetInfo, default_aux_layer_ids, target_info
from eaglekit.targets.load import Target, load_target
from eaglekit.targets.source import TargetSource, resolve_target

__all__ = [
    "Target", "TargetInfo", "TargetSource", "capture_aux_states", "decoder_layers",
    "default_aux_layer_ids", "load_target", "resolve_target", "target_info",
]
