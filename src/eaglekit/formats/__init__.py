"""Draft formats: SGLang, vLLM (speculators) and EAGLE. One rename table, export and import."""

from eaglekit.formats.detect import Interpretation, detect_format, interpret
from eaglekit.formats.export import export_draft
from eaglekit.formats.folder import DraftFolder, read_folder
from eaglekit.formats.importer import import_draft
from eaglekit.formats.names import FORMATS

__all__ = ["FORMATS", "DraftFolder", "Interpretation", "detect_format", "export_draft", "import_draft",
           "interpret", "read_folder"]
