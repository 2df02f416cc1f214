"""Draft formats: SGLang, vLLM (speculators) and EAGLE, one module each in one registry; export and import.

The names load on first use (`eaglekit.lazy`): the options read `formats.registry` alone, without torch.
"""

from eaglekit.lazy import lazy_exports

_HOMES = {
    "Interpretation": "detect",
    "detect_format": "detect",
    "interpret": "detect",
    "export_draft": "export",
    "DraftFolder": "folder",
    "read_folder": "folder",
    "import_draft": "importer",
    "FORMATS": "registry",
}
__all__ = sorted(_HOMES)
__getattr__ = lazy_exports(__name__, _HOMES)
