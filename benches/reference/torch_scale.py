# torch_scale.py: the PyTorch twins of netcl-bench --llama 1b,1b_lora,3b_lora (and the tiny twins): TinyLlama-1.1B and Llama-3.2-3B shapes (RMSNorm, RoPE on halves, SDPA with GQA, SwiGLU), torch.compile + bf16 autocast + fused AdamW + torch.utils.checkpoint per block, LoRA r16 on all linear layers over a bf16 base (peft when installed, else by hand). torch_bench.py --suite llama_scale runs it; run alone it takes --scale KEYS --batch N (CPU: a sanity run of the tiny twins).
import argparse, math, time
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# The H100 SXM's dense bf16 tensor-core peak (FLOP/s), what MFU divides by (as netcl-bench).
PEAK_BF16_FLOPS = 989e12

TINY_LLAMA = dict(dim=2048, layers=22, heads=32, kv_heads=4, hidden=5632, vocab=32000, tied=False,
                  theta=10000.0, scaling=None)
LLAMA_3B = dict(dim=3072, layers=28, heads=24, kv_heads=8, hidden=8192, vocab=128256, tied=True,
                theta=500000.0, scaling=(32.0, 1.0, 4.0, 8192))
# key: (record name, shape, context, LoRA); the tiny twins as netcl-bench builds them.
CONFIGS = {
    "1b": ("llama1b_bf16_ckpt", TINY_LLAMA, 2048, False),
    "1b_lora": ("llama1b_lora_r16_bf16_ckpt", TINY_LLAMA, 2048, True),
    "3b_lora": ("llama3b_lora_r16_bf16_ckpt", LLAMA_3B, 2048, True),
    "1b_tiny": ("llama1b_tiny", dict(TINY_LLAMA, dim=64, layers=2, heads=4, kv_heads=1, hidden=176, vocab=512), 64, False),
    "1b_lora_tiny": ("llama1b_lora_tiny", dict(TINY_LLAMA, dim=64, layers=2, heads=4, kv_heads=1, hidden=176, vocab=512), 64, True),
    "3b_lora_tiny": ("llama3b_lora_tiny", dict(LLAMA_3B, dim=96, layers=2, heads=6, kv_heads=2, hidden=264, vocab=1000), 64, True),
}
TARGETS = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")


def inv_freq(hd, theta, scaling):
    """RoPE's inverse frequencies; with Llama 3's scaling (factor, low, high, original context)."""
    f = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    if scaling is None:
        return f.float()
    factor, low, high, old = scaling
    wavelen = 2 * math.pi / f
    smooth = (old / wavelen - low) / (high - low)
    out = torch.where(wavelen > old / low, f / factor, f)
    mid = (wavelen >= old / high) & (wavelen <= old / low)
    return torch.where(mid, (1 - smooth) * f / factor + smooth * f, out).float()


def rope(x, cos, sin):
    """Hugging Face's rotate_half pairing (netcl's "halves") of x [B, T, heads, hd], in x's dtype."""
    t, half = x.shape[1], x.shape[-1] // 2
    c, s = cos[:t].view(1, t, 1, half).to(x.dtype), sin[:t].view(1, t, 1, half).to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), -1)


class Block(torch.nn.Module):
    def __init__(self, dim, heads, kv_heads, hidden):
        super().__init__()
        nn = torch.nn
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        kv = kv_heads * self.hd
        self.n1, self.n2 = nn.RMSNorm(dim, eps=1e-5), nn.RMSNorm(dim, eps=1e-5)
        self.wq, self.wk, self.wv = (nn.Linear(dim, n, bias=False) for n in (dim, kv, kv))
        self.wo = nn.Linear(dim, dim, bias=False)
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, h, cos, sin):
        b, t, _ = h.shape
        a = self.n1(h)
        q = rope(self.wq(a).view(b, t, self.heads, self.hd), cos, sin).transpose(1, 2)
        k = rope(self.wk(a).view(b, t, self.kv_heads, self.hd), cos, sin).transpose(1, 2)
        v = self.wv(a).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        h = h + self.wo(o.transpose(1, 2).reshape(b, t, -1))
        f = self.n2(h)
        return h + self.w2(F.silu(self.w1(f)) * self.w3(f))


class ScaleLlama(torch.nn.Module):
    """The netcl Llama of that shape: N(0, 0.02) weights, every block through torch.utils.checkpoint."""
    def __init__(self, dim, layers, heads, kv_heads, hidden, vocab, tied, theta, scaling, max_seq):
        super().__init__()
        nn = torch.nn
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads, hidden) for _ in range(layers))
        self.norm = nn.RMSNorm(dim, eps=1e-5)
        self.out = nn.Linear(dim, vocab, bias=False)
        if tied:
            self.out.weight = self.emb.weight
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, 0.0, 0.02)
        ang = torch.outer(torch.arange(max_seq).float(), inv_freq(dim // heads, theta, scaling))
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, ids):
        h = self.emb(ids)
        for blk in self.blocks:
            h = checkpoint(blk, h, self.cos, self.sin, use_reentrant=False)
        return self.out(self.norm(h))


class LoraLinear(torch.nn.Module):
    """A frozen Linear plus scale * x Aᵀ Bᵀ with A, B in f32 (PEFT's init: A as nn.Linear's, B zeros)."""
    def __init__(self, base, r, alpha):
        super().__init__()
        self.base = base
        dev = base.weight.device
        self.a = torch.nn.Parameter(torch.empty(r, base.in_features, device=dev))
        torch.nn.init.kaiming_uniform_(self.a, a=math.sqrt(5))
        self.b = torch.nn.Parameter(torch.zeros(base.out_features, r, device=dev))
        self.scale = alpha / r

    def forward(self, x):
        return self.base(x) + F.linear(F.linear(x, self.a), self.b) * self.scale


def add_lora(model, r, alpha):
    """Freezes the model and adds f32 adapters to every block projection: peft if installed, else by hand."""
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError:
        for blk in model.blocks:
            for name in TARGETS:
                setattr(blk, name, LoraLinear(getattr(blk, name), r, alpha))
        return model, "LoRA by hand"
    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(TARGETS))
    model = inject_adapter_in_model(cfg, model)
    for n, p in model.named_parameters():
        if "lora_" in n:
            p.data = p.data.float()
            p.requires_grad_(True)
    return model, "LoRA by peft"


def timed_steps(step, dev, warmup=2, iters=3, reps=3):
    """Median ms per step over `reps` batches of `iters` steps, the device synchronised around each."""
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        step()
    samples = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        sync()
        samples.append((time.perf_counter() - t0) * 1e3 / iters)
    return sorted(samples)[len(samples) // 2]


def run_scale(keys, batch, dev, rec, compile_model=True):
    for key in keys:
        name, shape, t, lora = CONFIGS[key]
        torch.manual_seed(0)
        model = ScaleLlama(**shape, max_seq=t).to(dev)
        how = "full"
        if lora:
            # The frozen base in bf16 (RoPE's tables stay f32), adapters and their state in f32.
            model = model.to(torch.bfloat16)
            model.cos, model.sin = model.cos.float(), model.sin.float()
            model, how = add_lora(model, 16, 32.0)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.1, fused=dev.type == "cuda")
        run = torch.compile(model) if compile_model else model
        x = torch.randint(0, shape["vocab"], (batch, t), device=dev)
        y = torch.randint(0, shape["vocab"], (batch, t), device=dev)

        def step():
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = F.cross_entropy(run(x).flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        ms = timed_steps(step, dev)
        d, hd = shape["dim"], shape["dim"] // shape["heads"]
        kv, v, layers = shape["kv_heads"] * hd, shape["vocab"], shape["layers"]
        # Parameters in products (all but an untied embedding table), as netcl-bench counts them.
        mm = layers * (2 * d * d + 2 * d * kv + 3 * d * shape["hidden"] + 2 * d) + d + v * d
        tokens = batch * t
        flops = (6 * mm + 6 * layers * d * t) * tokens
        mem = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else float("nan")
        rname = f"{name}_B{batch}_T{t}"
        print(f"torch {rname} ({how}, {'torch.compile' if compile_model else 'eager'}): "
              f"{tokens / ms * 1e3:.0f} tokens/s, {ms:.1f} ms/step, MFU {flops / (ms / 1e3) / PEAK_BF16_FLOPS:.3f}, "
              f"max_memory_allocated {mem:.2f} GiB")
        rec("llama", rname, ms, flops=flops)
        del model, run, opt, params
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--scale", default="1b_tiny,1b_lora_tiny,3b_lora_tiny")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--eager", action="store_true", help="no torch.compile")
    a = p.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    run_scale(a.scale.split(","), a.batch, dev, lambda *r, **k: None, compile_model=not a.eager)
