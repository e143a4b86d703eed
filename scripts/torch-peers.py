#!/usr/bin/env python3
# The torch and HF transformers peers of the GPU benchmarks, on a machine with
# torch (and, for prefill, transformers):
#   python3 scripts/torch-peers.py ceilings   device copy bandwidth, bf16 matmul rate
#   python3 scripts/torch-peers.py prefill    torch f16 linear on the SmolLM2-1.7B layer
#       shapes, causal sdpa of one layer at 4096 tokens, and HF transformers (random init
#       of the SmolLM2 135M, 360M and 1.7B shapes, bf16, sdpa) at pp512 and pp4096
#   python3 scripts/torch-peers.py offload [N]   HF transformers on the SmolLM2-1.7B shape
#       (random init, bf16, sdpa) at a depth of N tokens (default 32768): the prompt in one
#       pass, then greedy decode, with its offloaded cache (DynamicCache(offloading=True):
#       each layer's KV to host memory after use, the next layer's fetched ahead) and with
#       the cache on the GPU; tokens/s and peak device memory of each
import sys
import time
try:
    import torch
except ImportError:
    raise SystemExit("torch is not installed: no peers measured")
dev = torch.device("cuda:0")


# SmolLM2's shapes, for HF transformers' LlamaConfig.
SHAPES = {
    '135M': dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                 num_key_value_heads=3, rope_theta=100000),
    '360M': dict(hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15,
                 num_key_value_heads=5, rope_theta=100000),
    '1.7B': dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                 num_key_value_heads=32, rope_theta=130000),
}


def hf_model(name, max_positions=8192):
    """HF transformers' Llama of a SmolLM2 shape: random init (seed 0), bf16, sdpa, on the GPU."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=49152, max_position_embeddings=max_positions, tie_word_embeddings=True,
                      attn_implementation='sdpa', **SHAPES[name])
    torch.manual_seed(0)
    with torch.device(dev):
        return cfg, LlamaForCausalLM(cfg).to(dtype=torch.bfloat16).eval()


def timed(fn, reps):
    """The best of three runs of reps calls, in seconds a call."""
    fn(); torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = 1e30
    for _ in range(3):
        start.record()
        for _ in range(reps): fn()
        end.record(); torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1000 / reps)
    return best


def ceilings():
    print("torch", torch.__version__, torch.cuda.get_device_name(0))
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=dev); b = torch.empty_like(a)
    t = timed(lambda: b.copy_(a), 20)
    print(f"device-to-device copy of 1 GiB: {2 * n / t / 1e12:.2f} TB/s (read + write), "
          f"{n / t / 1e12:.2f} TB/s one way")
    for size in (4096, 8192):
        x = torch.randn(size, size, dtype=torch.bfloat16, device=dev)
        y = torch.randn(size, size, dtype=torch.bfloat16, device=dev)
        t = timed(lambda: x @ y, 20)
        print(f"bf16 matmul {size}^3: {2 * size ** 3 / t / 1e12:.1f} TFLOP/s")


def prefill():
    for (m, n, k) in [(4096, 6144, 2048), (4096, 2048, 2048), (4096, 16384, 2048), (4096, 2048, 8192), (512, 16384, 2048)]:
        x = torch.randn(m, k, dtype=torch.float16, device=dev); w = torch.randn(n, k, dtype=torch.float16, device=dev)
        t = timed(lambda: torch.nn.functional.linear(x, w), 20)
        print(f"f16 linear M={m} N={n} K={k}: {t*1e6:.0f} us, {2*m*n*k/t/1e12:.0f} TFLOP/s")
    q = torch.randn(1, 32, 4096, 64, dtype=torch.float16, device=dev)
    t = timed(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True), 20)
    print(f"sdpa causal 32 heads x 4096 x 64: {t*1e6:.0f} us, {4*32*4096*4096*64/2/t/1e12:.0f} TFLOP/s (causal half)")
    for name in SHAPES:
        _, model = hf_model(name)
        with torch.no_grad():
            for n in (512, 4096):
                ids = torch.randint(0, 49152, (1, n), device=dev)
                t = timed(lambda: model(ids, logits_to_keep=1), 3)
                print(f"HF transformers bf16 sdpa {name} pp{n}: {n/t:.0f} t/s")
        del model
        torch.cuda.empty_cache()


def offload():
    from transformers import DynamicCache
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 32768
    steps = 16
    cfg, model = hf_model('1.7B', max(8192, n + steps + 1))
    ids = torch.randint(0, 49152, (1, n), device=dev)
    for offloading in (True, False):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        cache = DynamicCache(config=cfg, offloading=offloading)
        with torch.no_grad():
            t0 = time.perf_counter()
            out = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            tok = out.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
            t_fill = time.perf_counter() - t0
            out = model(tok, past_key_values=cache, use_cache=True)  # warm-up step
            tok = out.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                out = model(tok, past_key_values=cache, use_cache=True)
                tok = out.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
            t_dec = time.perf_counter() - t0
        where = "offloaded cache" if offloading else "cache on the GPU"
        print(f"HF transformers bf16 sdpa 1.7B, {where}: prompt of {n} in {t_fill:.2f} s "
              f"({n / t_fill:.0f} t/s), then {steps} tokens at {steps / t_dec:.2f} t/s; "
              f"peak device memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB",
              flush=True)
        del cache, out


modes = {"ceilings": ceilings, "prefill": prefill, "offload": offload}
if len(sys.argv) < 2 or sys.argv[1] not in modes:
    raise SystemExit("usage: torch-peers.py ceilings|prefill|offload [N]")
modes[sys.argv[1]]()
