"""RoPE + KV-cache write at the Llama-3-8B shape: the pair of launches against the fused one,
and the LM head's greedy argmax with and without a float32 copy. Replayed from CUDA graphs."""

import functools
import sys

sys.path.insert(0, "bench")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from kernel_timing import graph_us  # noqa: E402

from loraplex.kernels import triton as tk  # noqa: E402

H, KV, D, BS = 32, 8, 128, 16


def pair(q, k, v, cos, sin, kc, vc, slots):
    q2, k2 = tk.apply_rotary_pos_emb(q, k, cos, sin)
    tk.reshape_and_cache(k2, v, kc, vc, slots)
    return q2


def greedy_old(h, w):
    return F.linear(h, w).float().argmax(dim=1)


def greedy_new(h, w):
    return F.linear(h, w).argmax(dim=1)


def main() -> None:
    dev, dt = torch.device("cuda"), torch.bfloat16
    for t in (64, 512, 4096):
        qkv = torch.randn(t, H + 2 * KV, D, device=dev, dtype=dt)
        q, k, v = qkv.split([H, KV, KV], dim=1)
        cos = torch.randn(t, D, device=dev, dtype=dt)
        sin = torch.randn(t, D, device=dev, dtype=dt)
        nb = t // BS + 64
        kc = torch.zeros(nb, BS, KV, D, device=dev, dtype=dt)
        vc = torch.zeros_like(kc)
        slots = torch.randperm(nb * BS, device=dev)[:t]
        args = (q, k, v, cos, sin, kc, vc, slots)
        old = graph_us(functools.partial(pair, *args))
        new = graph_us(functools.partial(tk.rotary_and_cache, *args))
        print(f"T {t:5d}: rotary + reshape_and_cache {old:6.2f} us, rotary_and_cache {new:6.2f} us")
    w = torch.randn(128256, 4096, device=dev, dtype=dt) * 0.02
    for rows in (64, 512):
        h = torch.randn(rows, 4096, device=dev, dtype=dt)
        head = graph_us(functools.partial(F.linear, h, w))
        old = graph_us(functools.partial(greedy_old, h, w))
        new = graph_us(functools.partial(greedy_new, h, w))
        same = torch.equal(greedy_old(h, w), greedy_new(h, w))
        print(
            f"rows {rows}: LM head {head:.1f} us; + float32 copy + argmax {old:.1f}; "
            f"+ argmax in bf16 {new:.1f}; same tokens {same}",
            flush=True,
        )


if __name__ == "__main__":
    main()
