"""The doctor: static checks of a draft folder as an engine reads it, a live probe, a diagnosis.

The names load on first use (`eaglekit.lazy`): `doctor/options.py` stays without torch.
"""

from eaglekit.lazy import lazy_exports

_HOMES = {"CHECKS": "checks", "Check": "checks", "Report": "run", "run_doctor": "run"}
__all__ = sorted(_HOMES)
__getattr__ = lazy_exports(__name__, _HOMES)
