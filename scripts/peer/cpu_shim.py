"""Run `speculators` (its CLI, unmodified) on a machine without an accelerator.

speculators 0.9.0's trainer is written for an accelerator: it moves the draft and each batch to
`local_rank` (`model.to(0)`, an accelerator index) and autocasts on "cuda" and its step timer synchronizes the accelerator, so on a CPU it stops with
"RuntimeError: Cannot access accelerator device when none is available". On such a machine this
launcher maps an integer device to the CPU, a "cuda" autocast to a CPU autocast of the same dtype and
the timer's synchronize to nothing, then hands the command line to speculators' own entry point. With an accelerator it changes nothing.

Run it with the peer's interpreter: `PEER_PY scripts/peer/cpu_shim.py train --verifier-name-or-path ...`
(the arguments of `speculators ...`).
"""

import sys

import torch


def _cpu(device):
    return "cpu" if isinstance(device, int) and not isinstance(device, bool) else device


def _patch_for_cpu() -> None:
    tensor_to, module_to, autocast = torch.Tensor.to, torch.nn.Module.to, torch.autocast

    def to_tensor(self, *args, **kwargs):
        if args:
            args = (_cpu(args[0]), *args[1:])
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        return tensor_to(self, *args, **kwargs)

    def to_module(self, *args, **kwargs):
        if args:
            args = (_cpu(args[0]), *args[1:])
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        return module_to(self, *args, **kwargs)

    class CpuAutocast(autocast):
        def __init__(self, device_type, *args, **kwargs):
            super().__init__("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    torch.Tensor.to = to_tensor
    torch.accelerator.synchronize = lambda *args, **kwargs: None  # its step timer syncs the device
    torch.nn.Module.to = to_module
    torch.autocast = CpuAutocast


if __name__ == "__main__":
    if not torch.accelerator.is_available():
        _patch_for_cpu()
    from speculators.__main__ import app

    sys.argv[0] = "speculators"
    sys.exit(app())
