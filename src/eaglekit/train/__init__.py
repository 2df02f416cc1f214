"""`eaglekit train`: training-time-test (TTT) training of an EAGLE-3 draft, online or offline, DDP, resumable."""
