# ddp_torch.py: netcl-bench --suite ddp's peer in PyTorch: NCCL all_reduce bus bandwidth (1 MiB..1 GiB) and the data-parallel step, one process per GPU, on 1 GPU and on --gpus GPUs: Llama-110M (DDP, 16 sequences of 512 per GPU, AdamW; f32, or bf16 autocast eager or compiled) and the 1B-class shape of torch_scale.py (4 x 2048 per GPU, bf16 autocast, every block checkpointed) under DDP or with ZeroRedundancyOptimizer (ZeRO-1).
#
#   NCCL_NVLS_ENABLE=0 python3 ddp_torch.py [--suite all_reduce,ddp] [--steps 8]
#       [--modes f32,bf16,bf16_compile,1b,1b_zero] [--gpus N]
#
# The netcl side: `cargo bench -p netcl --bench all_reduce` and `netcl-bench --suite ddp`
# (NETCL_BENCH_DDP names its modes).
import argparse, os, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_bench import Llama  # noqa: E402 (the same model netcl-bench's Llama suite compares with)
from torch_scale import ScaleLlama, TINY_LLAMA  # noqa: E402 (the 1B-class twin)
from torch.distributed.optim import ZeroRedundancyOptimizer  # noqa: E402

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


def llama_step(rank, world, steps, mode):
    """Tokens/s of the whole group (the slowest rank's step time) and this rank's peak memory."""
    dev = torch.device("cuda", rank)
    torch.manual_seed(0)
    big = mode.startswith("1b")
    if big:
        b, t, vocab = 4, 2048, TINY_LLAMA["vocab"]
        model = ScaleLlama(**TINY_LLAMA, max_seq=t).to(dev)
    else:
        b, t, vocab = B, T, VOCAB
        model = Llama(VOCAB, DIM, LAYERS, HEADS, HIDDEN).to(dev)
    zero = mode.endswith("_zero") and world > 1
    # With ZeRO-1 too, DDP all-reduces the gradients; the optimizer's state is sharded.
    run = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank]) if world > 1 else model
    if mode.endswith("_compile"):
        run = torch.compile(run)
    bf16 = mode != "f32"
    if zero:
        opt = ZeroRedundancyOptimizer(list(model.parameters()), optimizer_class=torch.optim.AdamW, lr=3e-4, weight_decay=0.1)
    else:
        decay = [p for p in model.parameters() if p.dim() > 1]
        rest = [p for p in model.parameters() if p.dim() <= 1]
        opt = torch.optim.AdamW([dict(params=decay), dict(params=rest, weight_decay=0.0)], lr=3e-4, weight_decay=0.1)
    g = torch.Generator(device=dev).manual_seed(rank)
    x = torch.randint(0, vocab, (b, t), device=dev, generator=g)
    y = torch.randint(0, vocab, (b, t), device=dev, generator=g)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = torch.nn.functional.cross_entropy(run(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    if world > 1:
        dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize(dev)
    secs = (time.perf_counter() - start) / steps
    mem = torch.cuda.max_memory_allocated(dev) / 2**30
    if world > 1:
        t_ = torch.tensor([secs, mem], device=dev)
        dist.all_reduce(t_, op=dist.ReduceOp.MAX)
        secs, mem = t_.tolist()
    return secs, world * b * t / secs, mem


def shape_name(mode):
    return "llama1b_step_B4_T2048" if mode.startswith("1b") else f"llama110m_step_B{B}_T{T}"


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
        for mode in args.modes.split(","):
            secs, tps, mem = llama_step(rank, world, args.steps, mode)
            if rank == 0:
                how = "ZeroRedundancyOptimizer" if mode.endswith("_zero") else "DDP"
                print(f"torch {how} {shape_name(mode)} {mode} per GPU, {world} GPUs: {secs * 1e3:.1f} ms/step, {tps:.0f} tokens/s, max_memory_allocated {mem:.2f} GiB a GPU", flush=True)
    dist.destroy_process_group()


def single(_rank, args):
    torch.backends.cuda.matmul.allow_tf32 = False
    done = set()
    for mode in args.modes.split(","):
        base = mode.removesuffix("_zero")
        if base in done:
            continue
        done.add(base)
        secs, tps, mem = llama_step(0, 1, args.steps, base)
        print(f"torch {shape_name(mode)} {base}, 1 GPU: {secs * 1e3:.1f} ms/step, {tps:.0f} tokens/s, max_memory_allocated {mem:.2f} GiB", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--suite", default="all_reduce,ddp")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--modes", default="f32", help="f32, bf16, bf16_compile, 1b, 1b_zero (comma-separated)")
    p.add_argument("--gpus", type=int, default=0, help="GPUs for the group (0: every GPU)")
    args = p.parse_args()
    world = args.gpus or torch.cuda.device_count()
    if "ddp" in args.suite.split(","):
        # In a child process too: the GPUs may run in exclusive-process mode.
        mp.spawn(single, args=(args,), nprocs=1, join=True)
    if world > 1:
        mp.spawn(worker, args=(world, args), nprocs=world, join=True)


if __name__ == "__main__":
    main()
