"""Pinned host<->device copy bandwidth with PyTorch: the peer for benches/transfer.rs, run on the same GPU."""
import os
import time

import torch

nbytes = int(os.environ.get("NETCL_BENCH_BYTES_INT", str(1 << 30)))
host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")


def timed(fn, reps=10):
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best


up = timed(lambda: dev.copy_(host, non_blocking=True))
down = timed(lambda: host.copy_(dev, non_blocking=True))
print(f"torch {torch.__version__} {torch.cuda.get_device_name()}: {nbytes >> 20} MiB pinned "
      f"host->device {nbytes / up / 1e9:.1f} GB/s, device->host {nbytes / down / 1e9:.1f} GB/s (best of 10)")
