"""`eaglekit bench`: tau, per-position acceptance and speedup of a draft, measured in eaglekit's engine."""
