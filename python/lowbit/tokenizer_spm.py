"""SentencePiece-style BPE (GGUF `tokenizer.ggml.model == "llama"`: Llama-2, Mistral, TinyLlama).

A GGUF stores such a vocabulary as pieces + scores + token types, with no merges. We rebuild the
`tokenizers` pipeline of Llama-2's own tokenizer.json, so ids match sentencepiece exactly:

- spaces are spelled "▁" and one "▁" goes in front of every run of plain text (SentencePiece's
  dummy prefix, also after a special token) unless the file says `add_space_prefix = false`;
  decoding drops it again. This is a normalizer, as in Llama-2's own tokenizer.json: a Metaspace
  pre-tokenizer would skip the prefix when the text already starts with a space, and " Hello"
  would lose a space (sentencepiece gives "▁▁Hello");
- merges are recovered from the scores: every split of a piece into two pieces is a merge, ranked
  by the merged piece's score (higher merges first);
- characters missing from the vocabulary become their UTF-8 bytes, spelled `<0xNN>` (byte fallback).
"""
from __future__ import annotations

import json
import re
from typing import Sequence

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import decoders, normalizers
from tokenizers.models import BPE

SPACE = "\u2581"  # SentencePiece's visible space
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def merges_from_scores(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """BPE merges implied by a scored piece vocabulary, best first.

    Ties keep a fixed order (longer left part, then longer right part, then vocabulary order) so the
    result is the same list transformers derives, merge for merge.
    """
    ids = {t: i for i, t in enumerate(tokens)}
    ranked = []
    for order, (piece, score) in enumerate(dict(zip(tokens, scores)).items()):
        splits = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in ids and piece[k:] in ids]
        for left, right in sorted(splits, key=lambda lr: (ids[lr[0]], ids[lr[1]])):
            ranked.append((-score, -len(left), -len(right), order, left, right))
    ranked.sort(key=lambda r: r[:4])  # stable, so equal keys stay in split order
    return [(left, right) for *_, left, right in ranked]


def build_backend(tokens: Sequence[str], scores: Sequence[float], add_space_prefix: bool = True) -> _HFTokenizer:
    """Model, pre-tokenizer and decoder of a SentencePiece-BPE vocabulary (no added tokens yet)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = BPE(vocab=vocab, merges=merges_from_scores(tokens, scores), fuse_unk=True, byte_fallback=True, dropout=None)
    backend = _HFTokenizer(bpe)
    prefix = [normalizers.Prepend(SPACE)] if add_space_prefix else []
    backend.normalizer = normalizers.Sequence(prefix + [normalizers.Replace(" ", SPACE)])
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))  # the space the normalizer added
    backend.decoder = decoders.Sequence(steps)
    return backend


def decoder_strip(decoder) -> bool | None:
    """For a SentencePiece decoder (▁ -> space, byte fallback, fuse[, strip one leading space]):
    whether it strips the leading space. None for any other decoder."""
    if decoder is None:
        return None
    state = json.loads(decoder.__getstate__())
    steps = state.get("decoders") if state.get("type") == "Sequence" else None
    if not steps or len(steps) not in (3, 4):
        return None
    head = [s.get("type") for s in steps[:3]]
    if head != ["Replace", "ByteFallback", "Fuse"] or steps[0] != {
            "type": "Replace", "pattern": {"String": SPACE}, "content": " "}:
        return None
    if len(steps) == 3:
        return False
    return steps[3] == {"type": "Strip", "content": " ", "start": 1, "stop": 0} or None


def piece_bytes(piece: str) -> bytes:
    """The bytes a piece decodes to: `<0xNN>` is one raw byte, anything else is text with ▁ as space."""
    m = _BYTE_PIECE.fullmatch(piece)
    return bytes([int(m.group(1), 16)]) if m else piece.replace(SPACE, " ").encode("utf-8")
