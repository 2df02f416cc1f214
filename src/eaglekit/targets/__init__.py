"""The target model: where it comes from, how it loads, its chat template and its aux states.

The names below load on first use (PEP 562), so that a stage's options module, which imports
`eaglekit.targets.options`, does not pull in torch and transformers: `eaglekit --help` stays fast.
"""

from eaglekit.lazy import lazy_exports

_HOMES = {
    "capture_aux_states": "capture",
    "decoder_layers": "capture",
    "TargetInfo": "info",
    "target_info": "info",
    "default_aux_layer_ids": "aux",
    "Target": "load",
    "load_target": "load",
    "TargetSource": "source",
    "resolve_target": "source",
}
__all__ = sorted(_HOMES)

__getattr__ = lazy_exports(__name__, _HOMES)
