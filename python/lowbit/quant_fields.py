"""QuantFields: one weight's QuantizedWeight fields (include/lowbit/quant/format.h) as numpy arrays.

Its own module, depending on nothing in lowbit, because both the quantizers (lowbit.quantize) and the checkpoint
readers (lowbit.models) build it; the formats themselves are described in lowbit/quantize/formats.py."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class QuantFields:
    """The QuantizedWeight fields of one weight as numpy arrays (q unpacked, one value per element)."""
    format: str
    n: int
    k: int
    group: int = 0
    symmetric: bool = False
    q: np.ndarray | None = None               # s8 (w8) | u8 holding u4 values (w4/qoq/liquid) | u8 e4m3 bits
    scales: np.ndarray | None = None
    zeros: np.ndarray | None = None
    channel_scales: np.ndarray | None = None
    mins: np.ndarray | None = None            # w4 only: f16 per-group minimum, w = q*s + m (GGUF Q4_1)
    extra: dict = field(default_factory=dict)  # per-weight metadata for the manifest (not tensors)

    @property
    def num_groups(self) -> int:
        return (self.k + self.group - 1) // self.group if self.group else 0
