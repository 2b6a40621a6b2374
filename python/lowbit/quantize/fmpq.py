"""FMPQ, COMET's fine-grained mixed-precision quantization (002 §3.2).

Activations are quantized per token in blocks of 128 channels, each block int4 or int8. On calibration data,
the outlier input channels of every linear are found (max|X_c| > ratio · median_c max|X|; ratio 8 by default)
and a permutation puts them first, so they fill as few 128-channel blocks as possible; those blocks are int8,
the rest int4. The permutation is applied to the weight's input columns. For down_proj it is folded into the
gate/up rows (free); for the other linears the engine must permute the activation (manifest `input_perm`,
shared by q/k/v and by gate/up). Weights: QoQ format g128 (level-2 u4 holding s8 per group, which the engine's
int32 FMPQ GEMM multiplies with the s8 activation blocks; COMET's symmetric int4 weights would be the same GEMM
on a narrower grid), clipped by output MSE. The fraction of int8 blocks per linear is reported.

The int8 budget: by default the blocks covering the outlier channels (ratio criterion above). With
`int8_fraction=f` the criterion is replaced by a budget: after the permutation, the round(f · blocks) blocks with
the largest max|X| run int8 (COMET keeps about 20%), so the accuracy/int8-share trade-off can be swept.
`awq_scales=True` applies AWQ's per-channel scaling (awq.py) before the permutation, a better-weights variant.
`pow2_scales=True` calibrates under the power-of-two block-scale activation format (activation_quant.py, issue 19);
a torch-model study option (the directory's activation format is the recipe's).
"""
from __future__ import annotations

import numpy as np
import torch

from . import transforms as T
from .activation_quant import FMPQ_BLOCK
from .pipeline import RTNBase, SITES
from .torch_model import linear_name

DEFAULT_OUTLIER_RATIO = 8.0


def outlier_permutation(x: torch.Tensor, ratio: float,
                        int8_fraction: float | None = None) -> tuple[torch.Tensor, np.ndarray, int]:
    """Returns (perm, block_bits u8 [ceil(k/128)], number of outlier channels) for inputs x [T, k].

    int8 blocks: those covering the outlier channels, or, when int8_fraction is given, the round(fraction · blocks)
    blocks of the permuted input with the largest max|X| (at least 0, at most all)."""
    k = x.shape[1]
    amax = x.abs().amax(0)
    outliers = amax > ratio * amax.median()
    order = torch.argsort(amax, descending=True)  # outliers first, largest first
    n_out = int(outliers.sum())
    nb = (k + FMPQ_BLOCK - 1) // FMPQ_BLOCK
    bits = np.full(nb, 4, dtype=np.uint8)
    if int8_fraction is None:
        bits[: (n_out + FMPQ_BLOCK - 1) // FMPQ_BLOCK] = 8
        return order, bits, n_out
    if not 0.0 <= int8_fraction <= 1.0:
        raise ValueError(f"fmpq: int8_fraction must be in [0, 1], got {int8_fraction}")
    n_int8 = int(np.floor(int8_fraction * nb + 0.5))  # half up: 0.1 of 5 blocks is one block, not zero
    # rank the blocks by their largest channel rather than assuming the order: the sort makes these the first
    # blocks, but the budget should follow the magnitudes if the permutation ever changes
    padded = torch.zeros(nb * FMPQ_BLOCK, dtype=amax.dtype)
    padded[:k] = amax[order]
    block_max = padded.view(nb, FMPQ_BLOCK).amax(1)
    top = torch.argsort(block_max, descending=True, stable=True)[:n_int8]
    bits[top.numpy()] = 8
    return order, bits, n_out


class FMPQ(RTNBase):
    name = "fmpq"
    clip = True

    def act_quant(self) -> str | None:
        return "fmpq_pow2" if self.options.get("pow2_scales") else self.spec.act

    def transform_layer(self, model, i, cap) -> bool:
        ratio = float(self.options.get("outlier_ratio", DEFAULT_OUTLIER_RATIO))
        fraction = self.options.get("int8_fraction")
        fraction = None if fraction is None else float(fraction)
        record = {}
        if self.options.get("awq_scales"):
            # AWQ's scaling first (it lowers the 4-bit weight error, which dominates FMPQ's loss with RTN-clipped
            # weights); the blocks are then chosen on the scaled inputs the linears will see
            from .awq import AWQ
            self.params.setdefault("scale_search", {})[i] = AWQ(self.spec).scale_layer(model, i, cap,
                                                                                       rescale_capture=True)
        for site, users in SITES.items():
            perm, bits, n_out = outlier_permutation(cap[site], ratio, fraction)
            names = [linear_name(i, u) for u in users]
            if site == "down_proj":
                T.permute_intermediate(model, i, perm)
            else:
                for n in names:
                    model.weights[n] = model.weights[n][:, perm].contiguous()
                    model.fake.input_perm[n] = perm.numpy().astype(np.int64)
            for n in names:
                model.fake.fmpq_block_bits[n] = bits
            record[site] = {"outlier_channels": n_out, "int8_block_fraction": float((bits == 8).mean())}
        self.params.setdefault("layers", {})[i] = record
        self.params["outlier_ratio"] = ratio
        self.params["int8_fraction"] = fraction
        return True

    def quantize_linear(self, model, name, x):
        f = super().quantize_linear(model, name, x)
        bits = model.fake.fmpq_block_bits[name]
        f.extra["fmpq_block_bits"] = bits.tolist()
        f.extra["int8_block_fraction"] = float((bits == 8).mean())
        return f
