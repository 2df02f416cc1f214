"""Cold compile of the batch decode step, SmolLM2-135M on this CPU: the whole step (`whole`) or each layer (`layers`,
the product's default since 5b51362). Run each form with an empty Inductor cache:
    rm -rf /tmp/c && TORCHINDUCTOR_CACHE_DIR=/tmp/c python compile_time.py whole   (then layers)
"""
import sys
import time

import torch

from eaglekit.engine.batch import BatchDecoder, Request, batch_runner
from eaglekit.engine.graphs import Step, compiled
from eaglekit.engine.sampling import Sampling
from eaglekit.targets import load_target
from eaglekit.targets.source import DEFAULT_TARGET

form = sys.argv[1]
t = load_target(DEFAULT_TARGET, device="cpu", dtype="float32")
dec = BatchDecoder(batch_runner(t.model, max_len=256, batch_size=4, attention="sdpa"), sampling=Sampling(),
                   graphs=False, compile=form == "layers", chunk=4)
if form == "whole":
    dec.step = Step(compiled(dec._step, True), use_graph=False, name="whole")
dec.set_stop_ids([-5])
dec.refill([0, 1, 2, 3], [Request(list(range(5, 25)), 64) for _ in range(4)])
start = time.perf_counter()
dec.step()
first = time.perf_counter() - start
start = time.perf_counter()
for _ in range(20):
    dec.step()
print(f"{form}: first step (compile) {first:.1f} s, then {1000 * (time.perf_counter() - start) / 20:.1f} ms a step "
      f"(torch {torch.__version__}, {torch.get_num_threads()} threads)")
