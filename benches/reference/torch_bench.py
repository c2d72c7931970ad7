# torch_bench.py: the netcl-bench workloads in PyTorch on the same GPU; with --netcl FILE prints the side-by-side table (ratio = PyTorch time / netcl time, >1 means netcl is faster; with CLBlast records in the netcl JSON also CLBlast's time and PyTorch/CLBlast).
import argparse
import os, json, torch

def timed(fn, warmup=3, iters=10, reps=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / iters)
    return sorted(samples)[len(samples) // 2]

class Llama(torch.nn.Module):
    """llama2.c's model.py shape: RMSNorm, RoPE (interleaved), causal SDPA, SwiGLU, tied embeddings."""
    def __init__(self, vocab, dim, layers, heads, hidden, max_seq=1024):
        super().__init__()
        nn = torch.nn
        self.heads, self.hd = heads, dim // heads
        self.emb = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList()
        for _ in range(layers):
            blk = nn.Module()
            blk.n1, blk.n2 = nn.RMSNorm(dim, eps=1e-5), nn.RMSNorm(dim, eps=1e-5)
            blk.wq, blk.wk, blk.wv, blk.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
            blk.w1, blk.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
            blk.w2 = nn.Linear(hidden, dim, bias=False)
            self.layers.append(blk)
        self.norm = nn.RMSNorm(dim, eps=1e-5)
        self.out = nn.Linear(dim, vocab, bias=False)
        self.out.weight = self.emb.weight
        freqs = 1.0 / (10000.0 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        ang = torch.outer(torch.arange(max_seq).float(), freqs)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def rope(self, x):
        b, t, h, d = x.shape
        x = x.float().reshape(b, t, h, d // 2, 2)
        c, s = self.cos[:t].view(1, t, 1, d // 2), self.sin[:t].view(1, t, 1, d // 2)
        x0, x1 = x[..., 0], x[..., 1]
        return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), -1).flatten(3)

    def forward(self, ids):
        F = torch.nn.functional
        h = self.emb(ids)
        b, t, _ = h.shape
        for blk in self.layers:
            a = blk.n1(h)
            q = self.rope(blk.wq(a).view(b, t, self.heads, self.hd)).transpose(1, 2)
            k = self.rope(blk.wk(a).view(b, t, self.heads, self.hd)).transpose(1, 2)
            v = blk.wv(a).view(b, t, self.heads, self.hd).transpose(1, 2)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + blk.wo(o.transpose(1, 2).reshape(b, t, -1))
            f = blk.n2(h)
            h = h + blk.w2(F.silu(blk.w1(f)) * blk.w3(f))
        return self.out(self.norm(h))

def main():
    p = argparse.ArgumentParser()
    p.add_argument("--suite", default="all")  # gemm,elementwise,softmax,norm,embedding,train,llama,attention,llama1b_gemm,lora1b_gemm
    p.add_argument("--sizes", default="1024,2048,4096")  # the gemm suite's square sizes
    p.add_argument("--json")
    p.add_argument("--netcl", help="netcl-bench --json output to compare against")
    # --suite llama_scale (only when named): the 1B-class twins of netcl-bench --llama 1b,1b_lora,3b_lora.
    p.add_argument("--scale", default="1b,1b_lora,3b_lora", help="llama_scale workloads (torch_scale.py)")
    p.add_argument("--batch", type=int, default=4, help="llama_scale batch (netcl-bench: NETCL_BENCH_BATCH)")
    a = p.parse_args()
    # TORCH_BENCH_TF32=1: f32 products and convolutions on TF32 tensor cores (netcl's
    # NETCL_MATMUL_PRECISION=high), for the side-by-side of training steps run that way.
    tf32 = os.environ.get("TORCH_BENCH_TF32") == "1"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    dev = torch.device("cuda")
    want = lambda s: a.suite == "all" or s in a.suite.split(",")
    records = []
    def rec(suite, name, ms, bytes_=0, flops=0):
        records.append(dict(suite=suite, name=name, ms=ms,
                            gbps=bytes_ / ms / 1e6 if bytes_ else None,
                            tflops=flops / ms / 1e9 if flops else None))
    if want("gemm"):
        for n in (int(x) for x in a.sizes.split(",")):
            x, y = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
            rec("gemm", f"sgemm_{n}", timed(lambda: x @ y), flops=2 * n**3)
            torch.backends.cuda.matmul.allow_tf32 = True
            rec("gemm", f"tf32_{n}", timed(lambda: x @ y), flops=2 * n**3)
            torch.backends.cuda.matmul.allow_tf32 = tf32
            for name, dt in (("bf16", torch.bfloat16), ("f16", torch.float16)):
                xh, yh = x.to(dt), y.to(dt)
                rec("gemm", f"{name}_{n}", timed(lambda: xh @ yh), flops=2 * n**3)
    def bf16_products(suite, products):
        # (layout, m, n, k, f32_out) in bf16 (nt: y = Wᵀ of a row-major W; tn: x = Yᵀ); where
        # netcl writes f32 (weight gradients, the LM head's logits) cuBLAS writes f32 too
        # (out_dtype), else bf16 as autocast does. Named as netcl-bench names them.
        bf = torch.bfloat16
        for layout, m, n, k, f32_out in products:
            x = torch.randn(k, m, device=dev, dtype=bf).t() if layout == "tn" else torch.randn(m, k, device=dev, dtype=bf)
            y = torch.randn(n, k, device=dev, dtype=bf).t() if layout == "nt" else torch.randn(k, n, device=dev, dtype=bf)
            if f32_out:
                try:
                    fn = lambda: torch.mm(x, y, out_dtype=torch.float32)
                    fn()
                except (TypeError, RuntimeError):
                    fn = lambda: torch.mm(x, y).float()
            else:
                fn = lambda: torch.mm(x, y)
            name = f"llama1b_gemm_{layout}_{m}x{n}x{k}" + ("_f32" if f32_out else "")
            rec(suite, name, timed(fn), flops=2 * m * n * k)
            del x, y
    if "llama1b_gemm" in a.suite.split(","):
        # netcl-bench --suite llama1b_gemm: the 1B-class step's products (forward nt, input
        # gradient nn, weight gradient tn).
        dim, kv, hidden, vocab = 2048, 256, 5632, 32000
        bf16_products("llama1b_gemm", [
            p for t in (8192, 16384)
            for out, inn in ((dim, dim), (kv, dim), (hidden, dim), (dim, hidden), (vocab, dim))
            for p in (("nt", t, out, inn, out == vocab), ("nn", t, inn, out, False), ("tn", out, inn, t, True))])
    if "lora1b_gemm" in a.suite.split(","):
        # netcl-bench --suite lora1b_gemm: a rank-16 adapter's products on each linear, 8192 tokens.
        t, r = 8192, 16
        bf16_products("lora1b_gemm", [
            p for out, inn in ((2048, 2048), (256, 2048), (5632, 2048), (2048, 5632))
            for p in (("nt", t, r, inn, False), ("nt", t, out, r, False), ("nn", t, r, out, False),
                      ("nn", t, inn, r, False), ("tn", out, r, t, True), ("tn", r, inn, t, True))])
    if want("elementwise"):
        n = 1 << 26
        x, y = torch.randn(n, device=dev), torch.randn(n, device=dev)
        rec("elementwise", "add_2^26", timed(lambda: x + y), bytes_=12 * n)
        rec("elementwise", "copy_2^26", timed(lambda: x.clone()), bytes_=8 * n)
    if want("softmax"):
        rows, cols = 1 << 14, 4096
        x = torch.randn(rows, cols, device=dev)
        rec("softmax", "softmax_16384x4096", timed(lambda: torch.softmax(x, -1)), bytes_=8 * rows * cols)
        short = x.reshape(rows * 4, cols // 4)
        rec("softmax", "softmax_65536x1024", timed(lambda: torch.softmax(short, -1)), bytes_=8 * rows * cols)
    if want("norm"):
        rows, cols = 1 << 14, 4096
        x = torch.randn(rows, cols, device=dev)
        w, b = torch.ones(cols, device=dev), torch.zeros(cols, device=dev)
        rec("norm", "layer_norm_16384x4096",
            timed(lambda: torch.nn.functional.layer_norm(x, (cols,), w, b, 1e-5)), bytes_=8 * rows * cols)
        rec("norm", "rms_norm_16384x4096",
            timed(lambda: torch.nn.functional.rms_norm(x, (cols,), w, 1e-5)), bytes_=8 * rows * cols)
    if want("embedding"):
        # The embedding gradient autograd runs (aten embedding_dense_backward), Llama-sized.
        v, d, n = 32000, 288, 8192
        s, ids = 7, []
        for _ in range(n):  # the netcl runner's LCG: the same token ids
            s = (s * 6364136223846793005 + 1442695040888963407) % 2**64
            ids.append((s >> 33) % v)
        ids = torch.tensor(ids, device=dev)
        g = torch.randn(n, d, device=dev)
        rec("embedding", f"embedding_backward_V{v}_D{d}_N{n}",
            timed(lambda: torch.ops.aten.embedding_dense_backward(g, ids, v, -1, False)),
            bytes_=4 * (n * d + v * d + n))
    # Backwards of the row ops (netcl-bench rows_backward): the gradient of an output already
    # computed, through torch.autograd.grad with the graph kept, so only the backward is timed.
    # Bytes: one read of every input, one write of every output, as netcl-bench counts them.
    F = torch.nn.functional
    def bwd(out, inputs, grad):
        return lambda: torch.autograd.grad(out, inputs, grad, retain_graph=True)
    if want("softmax"):
        rows, cols = 1 << 14, 4096
        x = torch.randn(rows, cols, device=dev, requires_grad=True)
        dy = torch.randn(rows, cols, device=dev)
        for r, c in ((rows, cols), (rows * 4, cols // 4)):
            xs = x.detach().reshape(r, c).requires_grad_()
            rec("softmax", f"softmax_bwd_{r}x{c}",
                timed(bwd(torch.softmax(xs, -1), xs, dy.reshape(r, c))), bytes_=12 * rows * cols)
        t = (torch.arange(rows, device=dev) * 7) % cols
        rec("softmax", f"cross_entropy_bwd_{rows}x{cols}",
            timed(bwd(F.cross_entropy(x, t), x, None)), bytes_=8 * rows * cols + 8 * rows)
    if want("norm"):
        rows, cols = 1 << 14, 4096
        x = torch.randn(rows, cols, device=dev, requires_grad=True)
        dy = torch.randn(rows, cols, device=dev)
        w = torch.ones(cols, device=dev, requires_grad=True)
        b = torch.zeros(cols, device=dev, requires_grad=True)
        rec("norm", f"layer_norm_bwd_{rows}x{cols}",
            timed(bwd(F.layer_norm(x, (cols,), w, b, 1e-5), (x, w, b), dy)),
            bytes_=4 * (3 * rows * cols + 3 * cols + 2 * rows))
        rec("norm", f"layer_norm_bwd_dx_{rows}x{cols}",
            timed(bwd(F.layer_norm(x, (cols,), None, None, 1e-5), x, dy)),
            bytes_=4 * (3 * rows * cols + 2 * rows))
        rec("norm", f"rms_norm_bwd_{rows}x{cols}",
            timed(bwd(F.rms_norm(x, (cols,), w, 1e-5), (x, w), dy)),
            bytes_=4 * (3 * rows * cols + 2 * cols + rows))
    if want("train"):
        nn = torch.nn
        torch.manual_seed(0)
        mlp = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
        cnn = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                            nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
        for name, model, shape in (("mlp_step", mlp, (256, 784)), ("cnn_step", cnn, (128, 1, 28, 28))):
            model = model.to(dev)
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)  # eager (foreach) update, PyTorch's default
            x = torch.randn(*shape, device=dev)
            y = (torch.arange(shape[0], device=dev) * 7) % 10
            def step():
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
            rec("train", name, timed(step))
            # The same step captured as a CUDA graph (capturable Adam: step count and lr on the
            # GPU), replayed with a new batch copied into the static input each time.
            gopt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
            def gstep():
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                gopt.step()
                return loss
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    gopt.zero_grad(set_to_none=True)
                    gstep()
            torch.cuda.current_stream().wait_stream(side)
            gopt.zero_grad(set_to_none=True)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                gstep()
            batch = torch.randn(*shape, device=dev)
            def replay():
                x.copy_(batch)
                graph.replay()
            rec("train", name + "_graph", timed(replay))
    if want("attention"):
        # Causal attention at the Llama benchmark shapes (netcl-bench --suite attention): PyTorch's
        # scaled_dot_product_attention (its fp32 kernels), forward and backward alone.
        # bf16 rows: its flash-attention kernels (tensor cores).
        # The 1B and 3B shapes (grouped key/value heads, head dims 64 and 128; the 1B one also without
        # grouping) in bf16 only.
        both = (torch.float32, torch.bfloat16)
        shapes = (((16, 12, 12, 512, 64), both), ((32, 6, 6, 256, 48), both),
                  ((4, 32, 4, 2048, 64), (torch.bfloat16,)), ((4, 32, 32, 2048, 64), (torch.bfloat16,)),
                  ((2, 24, 8, 2048, 128), (torch.bfloat16,)))
        for (b, h, hkv, t, d), dt in [(s, dt) for s, dts in shapes for dt in dts]:
            q, g = (torch.randn(b, h, t, d, device=dev, dtype=dt, requires_grad=True) for _ in range(2))
            k, v = (torch.randn(b, hkv, t, d, device=dev, dtype=dt, requires_grad=True) for _ in range(2))
            pairs = b * h * t * (t + 1) / 2
            kv = "" if hkv == h else f"_KV{hkv}"
            tag = f"B{b}_H{h}{kv}_T{t}_D{d}" + ("_bf16" if dt == torch.bfloat16 else "")
            sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hkv != h)
            rec("attention", f"attention_fwd_{tag}", timed(sdpa), flops=4 * pairs * d)
            rec("attention", f"attention_bwd_{tag}", timed(bwd(sdpa(), (q, k, v), g)), flops=10 * pairs * d)
    if want("llama"):
        for name, (d, layers, hidden, b, t) in (("llama15m_step_B32_T256", (288, 6, 768, 32, 256)),
                                                 ("llama110m_step_B16_T512", (768, 12, 2048, 16, 512))):
            torch.manual_seed(0)
            model = Llama(32000, d, layers, d // 64 if d == 768 else 6, hidden).to(dev)
            decay = [p for p in model.parameters() if p.dim() > 1]
            rest = [p for p in model.parameters() if p.dim() <= 1]
            opt = torch.optim.AdamW([dict(params=decay), dict(params=rest, weight_decay=0.0)], lr=3e-4, weight_decay=0.1)
            x = torch.randint(0, 32000, (b, t), device=dev)
            y = torch.randint(0, 32000, (b, t), device=dev)
            def step():
                loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            torch.cuda.reset_peak_memory_stats()
            ms = timed(step, warmup=2, iters=5, reps=3)
            rec("llama", name, ms)
            print(f"torch {name}: {b * t / ms * 1e3:.0f} tokens/s, max_memory_allocated {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
            def step_bf16():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            ms = timed(step_bf16, warmup=2, iters=5, reps=3)
            rec("llama", name + "_bf16_autocast", ms)
            print(f"torch {name} bf16 autocast: {b * t / ms * 1e3:.0f} tokens/s")
            del model, opt
    if want("llama_gemm"):
        # The f32 products of the Llama-110M and -15M steps, 8192 tokens (netcl-bench --suite llama_gemm).
        t, v = 8192, 32000
        for n, k in [s for d, h in ((768, 2048), (288, 768)) for s in ((d, d), (h, d), (d, h), (v, d))]:
            for layout, m, nn, kk in (("nt", t, n, k), ("nn", t, k, n), ("tn", n, k, t)):
                ga = torch.randn(kk, m, device=dev).t() if layout == "tn" else torch.randn(m, kk, device=dev)
                gb = torch.randn(nn, kk, device=dev).t() if layout == "nt" else torch.randn(kk, nn, device=dev)
                rec("llama_gemm", f"llama_gemm_{layout}_{m}x{nn}x{kk}", timed(lambda: ga @ gb), flops=2 * m * nn * kk)
                # The 110M products under bf16 autocast (bf16 operands; cuBLAS writes bf16).
                if n != 288 and k != 288:
                    ha, hb = ga.bfloat16(), gb.bfloat16()
                    if layout == "tn":
                        ha = ga.t().contiguous().bfloat16().t()
                    if layout == "nt":
                        hb = gb.t().contiguous().bfloat16().t()
                    rec("llama_gemm", f"llama_gemm_{layout}_{m}x{nn}x{kk}_bf16", timed(lambda: ha @ hb),
                        flops=2 * m * nn * kk)
                    del ha, hb
                del ga, gb
    if want("decode"):
        # The one-token decode ops at the 110M shape, batch 1 (netcl-bench --suite decode):
        # cuBLAS GEMV (F.linear) with the same epilogues, SDPA over 256 cached positions.
        d, hidden, vocab, heads, hd, s = 768, 2048, 32000, 12, 64, 256
        x, long = torch.randn(1, d, device=dev), torch.randn(1, hidden, device=dev)
        for name, n, k in (("decode_linear_N768_K768", d, d), ("decode_linear_N768_K2048", d, hidden),
                           ("decode_linear_N32000_K768", vocab, d)):
            w = torch.randn(n, k, device=dev)
            inp = x if k == d else long
            fn = (lambda: F.linear(inp, w) + x) if n == d else (lambda: F.linear(inp, w))
            rec("decode", name, timed(fn), bytes_=4 * (n * k + k + 2 * n), flops=2 * n * k)
        w1, w3 = torch.randn(hidden, d, device=dev), torch.randn(hidden, d, device=dev)
        rec("decode", "decode_swiglu_N2048_K768", timed(lambda: F.silu(F.linear(x, w1)) * F.linear(x, w3)),
            bytes_=4 * (2 * hidden * d + d + hidden), flops=4 * hidden * d)
        wqkv = torch.randn(3 * d, d, device=dev)
        rec("decode", "decode_qkv_N2304_K768", timed(lambda: F.linear(x, wqkv)), bytes_=4 * (3 * d * d + 4 * d), flops=6 * d * d)
        q = torch.randn(1, heads, 1, hd, device=dev)
        kc, vc = torch.randn(1, heads, s, hd, device=dev), torch.randn(1, heads, s, hd, device=dev)
        rec("decode", "decode_attention_H12_D64_S256", timed(lambda: F.scaled_dot_product_attention(q, kc, vc)),
            bytes_=4 * (2 * heads * s * hd + 2 * d), flops=4 * heads * s * hd)
    def hf_generate(prompts, n, dtype, big=False, static=False, warm=1):
        # transformers' greedy generate of n new tokens after each prompt (left-padded, one
        # batch), the 110M shape or (big) the 1B-class one: the seconds of one timed run.
        import time
        from transformers import LlamaConfig, LlamaForCausalLM
        torch.manual_seed(0)
        if big:
            cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, num_hidden_layers=22, num_attention_heads=32,
                              num_key_value_heads=4, intermediate_size=5632, max_position_embeddings=512)
        else:
            cfg = LlamaConfig(vocab_size=32000, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                              num_key_value_heads=12, intermediate_size=2048, max_position_embeddings=512)
        cfg.pad_token_id = 0
        model = LlamaForCausalLM(cfg).to(dev, dtype=dtype).eval()
        if static:
            model.generation_config.cache_implementation = "static"
            model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        longest = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (longest - len(p)) + p for p in prompts], device=dev)
        mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts], device=dev)
        def gen():
            with torch.no_grad():
                model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False)
            torch.cuda.synchronize()
        for _ in range(warm):
            gen()
        t0 = time.perf_counter()
        gen()
        return time.perf_counter() - t0

    prompt = [[1, 50, 300, 7]]
    if want("generate"):
        # The 110M shape in f32: 256 new tokens after a 4-token prompt, batch 1 (netcl-bench
        # --llama generate).
        secs = hf_generate(prompt, 256, torch.float32)
        rec("llama", "llama110m_generate_per_token", secs * 1e3 / 256)
        print(f"torch llama110m_generate (transformers {__import__('transformers').__version__}): {256 / secs:.0f} tokens/s")
    if "generate_static" in a.suite.split(","):
        # The same with transformers' static cache and torch.compile (only when named: compiling
        # takes minutes); reports the error where it fails.
        try:
            secs = hf_generate(prompt, 256, torch.float32, static=True, warm=2)
            rec("llama", "llama110m_generate_static_per_token", secs * 1e3 / 256)
            print(f"torch llama110m_generate static cache + torch.compile: {256 / secs:.0f} tokens/s")
        except Exception as e:
            print(f"torch llama110m_generate static cache + torch.compile failed: {type(e).__name__}: {str(e)[:300]}")
    # The twins of netcl-bench --llama generate_bf16, generate_b32, generate_1b: bf16 weights;
    # 32 prompts of 4 to 32 tokens.
    b32 = [[(1 + 37 * i + 11 * j) % 32000 for j in range(4 + (i * 7) % 29)] for i in range(32)]
    twins = {"generate_bf16": ("llama110m_bf16_generate", prompt, 256, False),
             "generate_b32": ("llama110m_bf16_generate_b32", b32, 256, False),
             "generate_1b": ("llama1b_bf16_generate", prompt, 128, True)}
    for g, (name, prompts, n, big) in twins.items():
        if g not in a.suite.split(","):
            continue
        secs = hf_generate(prompts, n, torch.bfloat16, big=big)
        tokens = len(prompts) * n
        rec("llama", name + "_per_token", secs * 1e3 / tokens)
        print(f"torch {name} (transformers): {tokens / secs:.0f} tokens/s")
    if "llama_scale" in a.suite.split(","):
        from torch_scale import run_scale
        run_scale(a.scale.split(","), a.batch, dev, rec)
    out = dict(framework="pytorch " + torch.__version__, device=torch.cuda.get_device_name(), records=records)
    if a.json:
        json.dump(out, open(a.json, "w"), indent=2)
    if a.netcl:
        ours = {r["name"]: r for r in json.load(open(a.netcl))["records"]}
        # CLBlast (the OpenCL GEMM peer) appears as clblast_<name> records in the netcl JSON.
        peer = any(k.startswith("clblast_") for k in ours)
        extra = f"{'clblast ms':>12}{'torch/clb':>10}" if peer else ""
        print(f"{'workload':<26}{'netcl ms':>11}{'torch ms':>11}{'ratio':>8}{extra}  netcl / torch rate")
        rate = lambda x: (f"{x['tflops']:.1f} TF/s" if x.get("tflops") else f"{x['gbps']:.0f} GB/s" if x.get("gbps") else "-")
        for r in records:
            o = ours.get(r["name"])
            if not o:
                continue
            c = ours.get("clblast_" + r["name"])
            col = (f"{c['ms']:>12.4f}{r['ms'] / c['ms']:>10.2f}" if c else f"{'-':>12}{'-':>10}") if peer else ""
            tail = f" (CLBlast {rate(c)})" if c else ""
            print(f"{r['name']:<26}{o['ms']:>11.4f}{r['ms']:>11.4f}{r['ms'] / o['ms']:>8.2f}{col}  {rate(o)} / {rate(r)}{tail}")
    else:
        for r in records:
            print(r)

if __name__ == "__main__":
    main()
