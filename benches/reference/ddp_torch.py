# ddp_torch.py: issue 15's peer in PyTorch: NCCL all_reduce bus bandwidth (1 MiB..1 GiB) and the Llama-110M data-parallel step (DDP, 16 sequences of 512 per GPU, f32, AdamW) on 1 GPU and on every GPU, one process per GPU.
#
#   NCCL_NVLS_ENABLE=0 python3 ddp_torch.py [--suite all_reduce,ddp] [--steps 8]
#
# The netcl side: `cargo bench -p netcl --bench all_reduce` and `netcl-bench --suite ddp`.
import argparse, os, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_bench import Llama  # noqa: E402 (the same model netcl-bench's Llama suite compares with)

VOCAB, DIM, LAYERS, HEADS, HIDDEN, B, T = 32000, 768, 12, 12, 2048, 16, 512


def all_reduce_sweep(rank, world):
    dev = torch.device("cuda", rank)
    size = 1 << 20
    while size <= 1 << 30:
        x = torch.ones(size // 4, device=dev)
        reps = max(3, min(200, (256 << 20) // size))
        for _ in range(3):
            dist.all_reduce(x)
        torch.cuda.synchronize(dev)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(x)
        torch.cuda.synchronize(dev)
        secs = (time.perf_counter() - start) / reps
        t = torch.tensor([secs], device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if rank == 0:
            bus = 2 * (world - 1) / world * size / t.item() / 1e9
            print(f"| {size} | {t.item() * 1e3:.3f} | {bus:.2f} |", flush=True)
        size *= 4


def llama_step(rank, world, steps):
    """Tokens/s of the whole group (the slowest rank's step time)."""
    dev = torch.device("cuda", rank)
    torch.manual_seed(0)
    model = Llama(VOCAB, DIM, LAYERS, HEADS, HIDDEN).to(dev)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    decay = [p for p in model.parameters() if p.dim() > 1]
    rest = [p for p in model.parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([dict(params=decay), dict(params=rest, weight_decay=0.0)], lr=3e-4, weight_decay=0.1)
    g = torch.Generator(device=dev).manual_seed(rank)
    x = torch.randint(0, VOCAB, (B, T), device=dev, generator=g)
    y = torch.randint(0, VOCAB, (B, T), device=dev, generator=g)

    def step():
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize(dev)
    if world > 1:
        dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize(dev)
    secs = (time.perf_counter() - start) / steps
    if world > 1:
        t = torch.tensor([secs], device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        secs = t.item()
    return secs, world * B * T / secs


def worker(rank, world, args):
    torch.backends.cuda.matmul.allow_tf32 = False
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    want = lambda s: s in args.suite.split(",")
    if want("all_reduce"):
        if rank == 0:
            print(f"NCCL all_reduce (sum, f32) over {world} GPUs ({torch.cuda.get_device_name(0)}, torch {torch.__version__}, NCCL {torch.cuda.nccl.version()})")
            print("| bytes | time (ms) | bus bandwidth (GB/s) |\n| ---: | ---: | ---: |", flush=True)
        all_reduce_sweep(rank, world)
    if want("ddp"):
        secs, tps = llama_step(rank, world, args.steps)
        if rank == 0:
            print(f"torch DDP llama110m_step_B{B}_T{T} per GPU, {world} GPUs: {secs * 1e3:.1f} ms/step, {tps:.0f} tokens/s", flush=True)
    dist.destroy_process_group()


def single(_rank, args):
    torch.backends.cuda.matmul.allow_tf32 = False
    secs, tps = llama_step(0, 1, args.steps)
    print(f"torch llama110m_step_B{B}_T{T}, 1 GPU: {secs * 1e3:.1f} ms/step, {tps:.0f} tokens/s", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--suite", default="all_reduce,ddp")
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()
    world = torch.cuda.device_count()
    if "ddp" in args.suite.split(","):
        # In a child process too: the GPUs may run in exclusive-process mode.
        mp.spawn(single, args=(args,), nprocs=1, join=True)
    if world > 1:
        mp.spawn(worker, args=(world, args), nprocs=world, join=True)


if __name__ == "__main__":
    main()
