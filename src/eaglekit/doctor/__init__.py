"""The doctor: static checks of a draft folder as an engine reads it, a live probe, a diagnosis."""

from eaglekit.doctor.checks import CHECKS, Check
from eaglekit.doctor.run import Report, run_doctor

__all__ = ["CHECKS", "Check", "Report", "run_doctor"]
