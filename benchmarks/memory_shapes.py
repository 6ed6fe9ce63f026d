"""Does resident memory grow when batch shapes vary? A training loop over random (B, T) batches.

    python benchmarks/memory_shapes.py fp32 400
    python benchmarks/memory_shapes.py bf16 40      # emulated bf16 on CPUs without AMX: slow
    AIAYN_MALLOC=default python benchmarks/memory_shapes.py fp32 400   # glibc's allocator defaults

A 2+2-layer d=128 model, V=8000, about 2,000 tokens per batch with T uniform in [5, 60], label-
smoothed loss and fused Adam as the trainer runs them; prints the resident set (``/proc/self/statm``)
eight times along the way. Users of other toolkits report RSS growing to several GB in such loops
under bf16 autocast; here the figures are printed, not asserted. Like the ``aiayn`` command, the loop
keeps freed memory in glibc's heap (:func:`aiayn.malloc.keep_freed_memory`) unless
``AIAYN_MALLOC=default``: with varying shapes, that is where fragmentation would show.
"""

from __future__ import annotations

import random
import sys
import time

import torch

from aiayn.config import TransformerConfig
from aiayn.malloc import keep_freed_memory
from aiayn.model import build_model
from aiayn.precision import autocast
from aiayn.train.loss import Seq2SeqObjective


def rss_mib() -> float:
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20


def main() -> None:
    kept = keep_freed_memory()  # first, as the aiayn command does
    precision, steps = sys.argv[1], int(sys.argv[2])
    print(f"{precision}, {steps} steps, freed memory kept in the heap: {kept}", flush=True)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    random.seed(0)
    config = TransformerConfig(src_vocab_size=8000, tgt_vocab_size=8000, d_model=128, n_heads=4,
                               n_encoder_layers=2, n_decoder_layers=2, d_ff=512, dropout=0.1)
    objective = Seq2SeqObjective(build_model(config), 0.1, 0)
    optimizer = torch.optim.Adam(objective.parameters(), fused=True)
    start = time.time()
    for i in range(steps):
        length = random.randint(5, 60)
        batch = max(1, 2000 // length)
        src, tgt = torch.randint(4, 8000, (batch, length)), torch.randint(4, 8000, (batch, length))
        with autocast(torch.device("cpu"), precision):
            loss, _ = objective(src, tgt, tgt)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if i % max(1, steps // 8) == 0 or i == steps - 1:
            print(f"step {i}: {rss_mib():.0f} MiB after {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
