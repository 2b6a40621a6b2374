"""FMPQ, COMET's fine-grained mixed-precision quantization (002 §3.2).

Activations are quantized per token in blocks of 128 channels, each block int4 or int8. On calibration data,
the outlier input channels of every linear are found (max|X_c| > ratio · median_c max|X|; ratio 8 by default)
and a permutation puts them first, so they fill as few 128-channel blocks as possible; those blocks are int8,
the rest int4. The permutation is applied to the weight's input columns. For down_proj it is folded into the
gate/up rows (free); for the other linears the engine must permute the activation (manifest `input_perm`,
shared by q/k/v and by gate/up). Weights: QoQ format g128 (level-2 u4 holding s8 per group, which the engine's
int32 FMPQ GEMM multiplies with the s8 activation blocks; COMET's symmetric int4 weights would be the same GEMM
on a narrower grid), clipped by output MSE. The fraction of int8 blocks per linear is reported.
"""
from __future__ import annotations

import numpy as np
import torch

from . import transforms as T
from .activation_quant import FMPQ_BLOCK
from .pipeline import RTNBase, SITES
from .torch_model import linear_name

DEFAULT_OUTLIER_RATIO = 8.0


def outlier_permutation(x: torch.Tensor, ratio: float) -> tuple[torch.Tensor, np.ndarray, int]:
    """Returns (perm, block_bits u8 [ceil(k/128)], number of outlier channels) for inputs x [T, k]."""
    k = x.shape[1]
    amax = x.abs().amax(0)
    outliers = amax > ratio * amax.median()
    order = torch.argsort(amax, descending=True)  # outliers first, largest first
    n_out = int(outliers.sum())
    nb = (k + FMPQ_BLOCK - 1) // FMPQ_BLOCK
    bits = np.full(nb, 4, dtype=np.uint8)
    bits[: (n_out + FMPQ_BLOCK - 1) // FMPQ_BLOCK] = 8
    return order, bits, n_out


class FMPQ(RTNBase):
    name = "fmpq"
    clip = True

    def transform_layer(self, model, i, cap) -> bool:
        ratio = float(self.options.get("outlier_ratio", DEFAULT_OUTLIER_RATIO))
        record = {}
        for site, users in SITES.items():
            perm, bits, n_out = outlier_permutation(cap[site], ratio)
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
        return True

    def quantize_linear(self, model, name, x):
        f = super().quantize_linear(model, name, x)
        bits = model.fake.fmpq_block_bits[name]
        f.extra["fmpq_block_bits"] = bits.tolist()
        f.extra["int8_block_fraction"] = float((bits == 8).mean())
        return f
