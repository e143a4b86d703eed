#!/usr/bin/env python3
# Reference GEMV rates on this GPU: torch (cuBLAS) f16 GEMV for the 1.7B and 135M shapes,
# weights rotated so that L2 (50 MB) holds none of them; and a plain read of 1 GiB.
import torch
torch.manual_seed(0)
dev = 'cuda'
def bench(fn, reps=50):
    s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
    for _ in range(5): fn()
    torch.cuda.synchronize(); s.record()
    for _ in range(reps): fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / reps * 1e3  # us
big = torch.randn(512 * 1024 * 1024, device=dev, dtype=torch.float16)
t = bench(lambda: big.sum(), 20)
print(f"read 1 GiB (sum): {t:.1f} us, {big.numel()*2/t/1e6:.2f} TB/s")
t = bench(lambda: big.view(-1, 1024).amax(dim=1), 20)
print(f"read 1 GiB (amax rows): {t:.1f} us, {big.numel()*2/t/1e6:.2f} TB/s")
for (n, k) in [(6144, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (49152, 2048), (960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)]:
    copies = max(2, int(400e6 // (n * k * 2)))
    ws = [torch.randn(n, k, device=dev, dtype=torch.float16) * 0.02 for _ in range(copies)]
    x = torch.randn(1, k, device=dev, dtype=torch.float16)
    i = [0]
    def f():
        i[0] = (i[0] + 1) % copies
        return torch.nn.functional.linear(x, ws[i[0]])
    t = bench(f, 100)
    print(f"f16 gemv {n}x{k}: {t:.2f} us, {n*k*2/t/1e6:.2f} TB/s")
    del ws
