"""Calibration data: token sequences cut from the calibration texts (never the evaluation text)."""
from __future__ import annotations

from pathlib import Path

import torch



class CalibrationError(ValueError):
    pass


def calibration_tokens(tokenizer, paths: list[str | Path], num_sequences: int, seq_len: int) -> torch.Tensor:
    """Concatenate the texts, tokenize, and cut `num_sequences` consecutive windows of `seq_len` tokens.

    Raises CalibrationError before any long computation when the texts hold too few tokens."""
    if num_sequences <= 0 or seq_len < 2:
        raise CalibrationError(f"calibration: need num_sequences >= 1 and seq_len >= 2, got "
                               f"{num_sequences} and {seq_len}")
    files = []
    for p in paths:
        p = Path(p)
        files.extend(sorted(p.glob("*.txt")) if p.is_dir() else [p])
    if not files:
        raise CalibrationError(f"calibration: no .txt files in {', '.join(map(str, paths))}")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise CalibrationError(f"calibration: file(s) not found: {', '.join(missing)}")
    ids: list[int] = []
    for f in files:
        ids.extend(tokenizer.encode(f.read_text(encoding="utf-8"), add_special_tokens=False))
    need = num_sequences * seq_len
    if len(ids) < need:
        raise CalibrationError(f"calibration text too short: {len(ids)} tokens in {len(files)} file(s), need "
                               f"{need} ({num_sequences} sequences x {seq_len} tokens); add text or lower "
                               "--calib-seqs/--calib-len")
    return torch.tensor(ids[:need], dtype=torch.int64).view(num_sequences, seq_len)
