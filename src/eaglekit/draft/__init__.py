"""The EAGLE-3 draft: configuration, model, vocabulary mapping and the native checkpoint."""

from eaglekit.draft.config import DraftConfig
from eaglekit.draft.model import Eagle3Draft

__all__ = ["DraftConfig", "Eagle3Draft"]
