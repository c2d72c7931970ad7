# numpy_cpu_bench.py: the CPU side-by-side in one run: netcl-cpu-bench (host backend and PoCL) then the same workloads in numpy/OpenBLAS (SGEMM 256..2048, MLP 784-1024-1024-10 Adam step at batch 256), every library given the same thread count; prints the table (ratio = numpy time / netcl time, >1 means netcl is faster).
# Usage: python3 benches/reference/numpy_cpu_bench.py --netcl-bin target/release/netcl-cpu-bench [--threads N] [--out FILE]
import argparse, json, os, subprocess, sys, time

p = argparse.ArgumentParser()
p.add_argument("--netcl-bin", required=True, help="path of the built netcl-cpu-bench binary")
p.add_argument("--threads", type=int, default=os.cpu_count())
p.add_argument("--sizes", default="256,512,1024,2048")
p.add_argument("--out", default="cpu_bench.json")
args = p.parse_args()

# The same thread count for OpenBLAS (set before numpy loads it), the host backend's rayon pool and
# matrixmultiply, and PoCL's pthread driver.
threads = str(args.threads)
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS",
            "MATMUL_NUM_THREADS", "POCL_MAX_PTHREAD_COUNT"):
    os.environ[var] = threads

import numpy as np

netcl_json = args.out + ".netcl.json"
subprocess.run([args.netcl_bin, "--out", netcl_json, "--sizes", args.sizes], check=True)
with open(netcl_json) as f:
    netcl = json.load(f)


def timed(fn, warmup=1, iters=3, reps=5):
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - t) / iters)
    return sorted(samples)[len(samples) // 2]


rng = np.random.default_rng(1)
numpy_ms = {}
for n in map(int, args.sizes.split(",")):
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    iters = int(min(20, max(1, 2e9 / (2 * n**3))))
    numpy_ms[f"sgemm_{n}"] = timed(lambda: a @ b, iters=iters) * 1e3


class Mlp:
    """784-1024-1024-10, ReLU, softmax cross-entropy, Adam (lr 1e-3): forward, backward, update."""

    def __init__(self, batch=256):
        dims = [784, 1024, 1024, 10]
        self.w = [rng.standard_normal((i, o), dtype=np.float32) / np.float32(np.sqrt(i))
                  for i, o in zip(dims, dims[1:])]
        self.b = [np.zeros(o, np.float32) for o in dims[1:]]
        self.params = self.w + self.b
        self.m = [np.zeros_like(q) for q in self.params]
        self.v = [np.zeros_like(q) for q in self.params]
        self.t = 0
        self.x = rng.standard_normal((batch, 784), dtype=np.float32)
        self.y = np.arange(batch) * 7 % 10

    def step(self):
        acts, h = [self.x], self.x
        for i, (w, b) in enumerate(zip(self.w, self.b)):
            h = h @ w + b
            if i < 2:
                h = np.maximum(h, 0)
            acts.append(h)
        z = h - h.max(1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(1, keepdims=True)
        g = p
        g[np.arange(len(self.y)), self.y] -= 1
        g /= np.float32(len(self.y))
        gw, gb = [None] * 3, [None] * 3
        for i in reversed(range(3)):
            gw[i] = acts[i].T @ g
            gb[i] = g.sum(0)
            if i > 0:
                g = (g @ self.w[i].T) * (acts[i] > 0)
        self.t += 1
        lr, b1, b2, eps = 1e-3, 0.9, 0.999, 1e-8
        c1, c2 = 1 - b1**self.t, 1 - b2**self.t
        for q, gq, m, v in zip(self.params, gw + gb, self.m, self.v):
            m *= b1
            m += (1 - b1) * gq
            v *= b2
            v += (1 - b2) * gq * gq
            q -= np.float32(lr / c1) * m / (np.sqrt(v / np.float32(c2)) + np.float32(eps))


mlp = Mlp()
numpy_ms["mlp_step"] = timed(mlp.step, warmup=2) * 1e3

print(f"\nthreads {threads}; numpy {np.__version__}")
cfg = np.show_config(mode="dicts") if "mode" in np.show_config.__code__.co_varnames else {}
blas = cfg.get("Build Dependencies", {}).get("blas", {})
if blas:
    print(f"numpy BLAS: {blas.get('name')} {blas.get('version')}")
print(f"{'device':<48} {'workload':<12} {'netcl ms':>10} {'numpy ms':>10} {'ratio':>7}")
rows = []
for r in netcl:
    ref = numpy_ms.get(r["name"])
    ratio = ref / r["ms"] if ref else None
    rows.append({**r, "numpy_ms": ref, "ratio": ratio})
    print(f"{r['device'][:48]:<48} {r['name']:<12} {r['ms']:>10.3f} {ref:>10.3f} {ratio:>7.2f}")
with open(args.out, "w") as f:
    json.dump({"threads": args.threads, "numpy": np.__version__, "rows": rows}, f, indent=1)
print(f"wrote {args.out}", file=sys.stderr)
