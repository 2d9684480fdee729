"""Which order PyTorch's CUDA reduction sums a float32 row in: `row_sum_cuda_order` (the spec of
the Triton RMSNorm's sum) against `x.pow(2).sum(-1)` and HF's `pow(2).mean(-1)` on the GPU.

    python bench/row_sum_order.py [--rows 2048] [--json FILE]

For each hidden size and batch size T (rows reduced in one call: T = 1 at HF's decode step), the
share of rows whose sum equals each candidate order bit for bit: the layout `row_sum_lanes`
picks, and every other (vectorized, lanes) for comparison. (A first form also tried an
adjacent-pairs tree within the last warp: no row matched it, bench/results/
h200-684065b-rms-order-mixed-split/call3.) Then the Triton RMSNorm against
HF's math run on each row alone. Random rows of mixed scale; a wrong order differs in a large
share of rows (the sum's last bit), not in a few.
"""

from __future__ import annotations

import argparse
import json

import torch

from loraplex.kernels.reference.fused_ops import (
    inverse_float32,
    rms_norm,
    row_sum_cuda_order,
    row_sum_lanes,
)
from loraplex.kernels.triton.rms_norm import rms_norm as triton_rms_norm

HIDDEN_SIZES = (64, 96, 576, 960, 2048, 3584, 4096, 5120, 8192)
BATCHES = (1, 4, 8, 16, 64)


LAYOUTS = [(vectorized, lanes) for vectorized in (True, False) for lanes in (32, 64, 128, 256, 512)]


def torch_sums(x: torch.Tensor, batch: int) -> torch.Tensor:
    """Each group of `batch` rows summed by PyTorch in one call."""
    return torch.cat([x[i : i + batch].pow(2).sum(-1) for i in range(0, len(x), batch)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.manual_seed(0)
    results: dict[str, dict] = {}
    for n in HIDDEN_SIZES:
        scale = torch.exp(2 * torch.randn(args.rows, 1, device="cuda"))
        x = torch.randn(args.rows, n, device="cuda") * scale
        squares = x * x
        for batch in BATCHES:
            sums = torch_sums(x, batch)
            matches = {}
            for vectorized, lanes in LAYOUTS:
                ours = row_sum_cuda_order(squares, (vectorized, lanes))
                matches[f"vec={int(vectorized)} lanes={lanes}"] = round(
                    (ours == sums).float().mean().item(), 4
                )
            default = row_sum_cuda_order(squares)
            best = sorted(matches.items(), key=lambda kv: -kv[1])[:3]
            share = round((default == sums).float().mean().item(), 4)
            mean_ok = torch.equal(
                torch.cat([x[i : i + batch].pow(2).mean(-1) for i in range(0, len(x), batch)]),
                default * inverse_float32(n),
            )
            print(
                f"hidden {n:5d} T={batch:3d}: row_sum_lanes {row_sum_lanes(n)} equal in "
                f"{share:.4f} of rows (mean too: {mean_ok}); best {best}"
            )
            results[f"{n}/T{batch}"] = {"default_share": share, "mean_equal": mean_ok, **matches}
        xb = x.to(torch.bfloat16)
        weight = (1 + 0.1 * torch.randn(n, device="cuda")).to(torch.bfloat16)
        ours = triton_rms_norm(xb, weight, 1e-5)
        hf = torch.cat([rms_norm(xb[i : i + 1], weight, 1e-5) for i in range(len(xb))])
        differ = (ours != hf).float().mean().item()
        rows = (ours != hf).any(-1).float().mean().item()
        print(
            f"hidden {n:5d}: Triton RMSNorm vs HF one row at a time: {differ:.6f} of elements "
            f"differ, in {rows:.4f} of rows"
        )
        results[f"{n}/triton_vs_hf_rows"] = {"elements": differ, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
