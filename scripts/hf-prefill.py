#!/usr/bin/env python3
# Peers for prefill on a GPU machine with torch and transformers: torch f16 linear on the
# SmolLM2-1.7B layer shapes, causal sdpa of one layer at 4096 tokens, and HF transformers
# (random init of the SmolLM2 135M, 360M and 1.7B shapes, bf16, sdpa) at pp512 and pp4096.
#   python3 scripts/hf-prefill.py
import time, torch
from transformers import LlamaConfig, LlamaForCausalLM
dev = 'cuda'
def timed(fn, reps):
    fn(); torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = 1e30
    for _ in range(3):
        s.record()
        for _ in range(reps): fn()
        e.record(); torch.cuda.synchronize()
        best = min(best, s.elapsed_time(e) / 1000 / reps)
    return best
for (m, n, k) in [(4096, 6144, 2048), (4096, 2048, 2048), (4096, 16384, 2048), (4096, 2048, 8192), (512, 16384, 2048)]:
    x = torch.randn(m, k, dtype=torch.float16, device=dev); w = torch.randn(n, k, dtype=torch.float16, device=dev)
    t = timed(lambda: torch.nn.functional.linear(x, w), 20)
    print(f"f16 linear M={m} N={n} K={k}: {t*1e6:.0f} us, {2*m*n*k/t/1e12:.0f} TFLOP/s")
q = torch.randn(1, 32, 4096, 64, dtype=torch.float16, device=dev)
t = timed(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True), 20)
print(f"sdpa causal 32 heads x 4096 x 64: {t*1e6:.0f} us, {4*32*4096*4096*64/2/t/1e12:.0f} TFLOP/s (causal half)")
shapes = {  # SmolLM2 135M, 360M, 1.7B
    '135M': dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                 num_key_value_heads=3, rope_theta=100000),
    '360M': dict(hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15,
                 num_key_value_heads=5, rope_theta=100000),
    '1.7B': dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                 num_key_value_heads=32, rope_theta=130000),
}
for name, kw in shapes.items():
    cfg = LlamaConfig(vocab_size=49152, max_position_embeddings=8192, tie_word_embeddings=True,
                      attn_implementation='sdpa', **kw)
    torch.manual_seed(0)
    with torch.device(dev):
        model = LlamaForCausalLM(cfg).to(dtype=torch.bfloat16).eval()
    with torch.no_grad():
        for n in (512, 4096):
            ids = torch.randint(0, 49152, (1, n), device=dev)
            t = timed(lambda: model(ids, logits_to_keep=1), 3)
            print(f"HF transformers bf16 sdpa {name} pp{n}: {n/t:.0f} t/s")
    del model
    torch.cuda.empty_cache()
