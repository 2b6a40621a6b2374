"""The tokenizer of a model that has none (a config.json-only directory with random weights): token i reads as
the text "<i>", tokens joined by spaces, so every generated token streams as visible text and a completion's
text can be sent back as a prompt. Other text has no tokens: such a prompt is refused with a message saying
to send token ids."""
from __future__ import annotations

import re
from typing import Any, Iterable

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import models

from ..tokenizer import Tokenizer

_TOKEN = re.compile(r"<(\d+)>")
_ONLY_TOKENS = re.compile(r"\s*(<\d+>\s*)+")


class TokenIdTokenizer(Tokenizer):
    def __init__(self, vocab_size: int, eos_token_ids: Iterable[int] = ()) -> None:
        # A word-level vocabulary "<0>".."<vocab-1>": the base class streams and decodes through it unchanged.
        backend = _HFTokenizer(models.WordLevel({f"<{i}>": i for i in range(vocab_size)}, unk_token="<0>"))
        super().__init__(backend, eos_token_ids=eos_token_ids)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not _ONLY_TOKENS.fullmatch(text):
            raise ValueError("this model has no tokenizer (its directory has no tokenizer.json): send the prompt "
                             "as a list of token ids, or as text of the form '<12> <345>'")
        ids = [int(m) for m in _TOKEN.findall(text)]
        bad = [t for t in ids if t >= self.vocab_size]
        if bad:
            raise ValueError(f"token <{bad[0]}> is outside the vocabulary [0, {self.vocab_size})")
        return ids

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        return [self.encode(t, add_special_tokens) for t in texts]

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            **kwargs: Any) -> str:
        raise ValueError("this model has no tokenizer and no chat template (its directory has no tokenizer.json): "
                         "use /v1/completions with token ids")
