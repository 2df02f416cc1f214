"""The EAGLE-3 draft: configuration, model, vocabulary mapping and the native checkpoint.

`DraftConfig` and `Eagle3Draft` load on first use (PEP 562): the options modules that read
`draft.config`'s defaults do not pull in torch.
"""

from eaglekit.lazy import lazy_exports

_HOMES = {"DraftConfig": "config", "Eagle3Draft": "model"}
__all__ = sorted(_HOMES)

__getattr__ = lazy_exports(__name__, _HOMES)
