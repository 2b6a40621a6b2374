"""Tokenizer: HF `tokenizers` underneath, built from GGUF metadata or from a tokenizer.json.

The GGUF path rebuilds the model family's own tokenizer.json pipeline (byte-level BPE with the
normalizer and pre-tokenizer implied by `tokenizer.ggml.pre`; SentencePiece BPE, see tokenizer_spm;
control tokens as special added tokens), so ids match the model's own tokenizer. transformers' GGUF
loader differs where it simplifies: it gives every byte-level vocabulary GPT-2's split, and puts
SentencePiece's prefix space only where a text does not start with one. Chat templates render with
jinja2 the way transformers renders them.
"""
from __future__ import annotations

import codecs
import json
import re
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers.models import BPE

from . import tokenizer_spm
from .gguf_reader import read_gguf_metadata  # imports gguf only when a file is read

# llama.cpp token types (tokenizer.ggml.token_type).
_CONTROL, _USER_DEFINED = 3, 4

# Byte-level BPE pre-tokenizers by `tokenizer.ggml.pre`, rebuilt as each model family's tokenizer.json
# defines them (llama.cpp's converter writes the name, not the regexes).

# GPT-2's own split (ByteLevel's built-in regex).
_GPT2_PRES = ("default", "gpt-2", "gpt2")
# StarCoder and its descendants first isolate every numeric character (Digits(individual_digits=True):
# any Unicode number, so "4 ½" keeps its space apart from "½"), then split as GPT-2 does.
_DIGIT_PRES = ("smollm", "starcoder", "refact", "codeshell")
# MPT uses GPT-NeoX's tokenizer: NFC-normalized text, then GPT-2's split.
_NFC_GPT2_PRES = ("mpt",)
# Every pre whose tokenizer.json normalizes to NFC first (Qwen2's, as transformers' Qwen2 converter writes it).
_NFC_PRES = _NFC_GPT2_PRES + ("qwen2",)

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Mistral's Tekken (Mistral-Nemo): words split at case changes (upper-case run, then lower-case run), each
# numeric character alone, punctuation runs that may swallow trailing line breaks and slashes.
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# DeepSeek-LLM: line breaks alone; words of cased letters (Latin, Greek, Cyrillic, Armenian, Georgian,
# Cherokee, Glagolitic, Coptic, full-width, Deseret, Osage, Old Hungarian, Warang Citi, Adlam, ...)
# with one leading space; ASCII/full-width punctuation runs; trailing spaces; CJK and Hangul runs; numbers.
_DEEPSEEK_CASED_RANGES = (
    (0x41, 0x5A), (0x61, 0x7A), (0xB5, 0xB5), (0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x1BA), (0x1BC, 0x1BF),
    (0x1C4, 0x293), (0x295, 0x2AF), (0x370, 0x373), (0x376, 0x377), (0x37B, 0x37D), (0x37F, 0x37F),
    (0x386, 0x386), (0x388, 0x38A), (0x38C, 0x38C), (0x38E, 0x3A1), (0x3A3, 0x3F5), (0x3F7, 0x481),
    (0x48A, 0x52F), (0x531, 0x556), (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA),
    (0x1CBD, 0x1CBF), (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1F15), (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57), (0x1F59, 0x1F59), (0x1F5B, 0x1F5B), (0x1F5D, 0x1F5D),
    (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC), (0x1FBE, 0x1FBE), (0x1FC2, 0x1FC4), (0x1FC6, 0x1FCC),
    (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB), (0x1FE0, 0x1FEC), (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC), (0x2102, 0x2102),
    (0x2107, 0x2107), (0x210A, 0x2113), (0x2115, 0x2115), (0x2119, 0x211D), (0x2124, 0x2124), (0x2126, 0x2126),
    (0x2128, 0x2128), (0x212A, 0x212D), (0x212F, 0x2134), (0x2139, 0x2139), (0x213C, 0x213F), (0x2145, 0x2149),
    (0x214E, 0x214E), (0x2183, 0x2184), (0x2C00, 0x2C7B), (0x2C7E, 0x2CE4), (0x2CEB, 0x2CEE), (0x2CF2, 0x2CF3),
    (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F), (0xA771, 0xA787), (0xA78B, 0xA78E), (0xAB70, 0xABBF),
    (0xFB00, 0xFB06), (0xFB13, 0xFB17), (0xFF21, 0xFF3A), (0xFF41, 0xFF5A), (0x10400, 0x1044F),
    (0x104B0, 0x104D3), (0x104D8, 0x104FB), (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x118A0, 0x118DF),
    (0x1E900, 0x1E943),
)
_DEEPSEEK_PUNCT_RANGES = ((0x21, 0x2F), (0x3A, 0x7E), (0xFF01, 0xFF0F), (0xFF1A, 0xFF5E), (0x2018, 0x201F),
                          (0x3000, 0x3002))
_DEEPSEEK_CJK_RANGES = ((0x4E00, 0x9FA5), (0x0800, 0x4E00), (0xAC00, 0xD7FF))


def _char_class(ranges) -> str:
    """A regex character class from inclusive code-point ranges."""
    return "[" + "".join(re.escape(chr(lo)) + ("" if lo == hi else "-" + re.escape(chr(hi))) for lo, hi in ranges) + "]"


_DEEPSEEK_LLM_SPLITS = (
    r"[\r\n]",
    r"\s?" + _char_class(_DEEPSEEK_CASED_RANGES) + "+",
    r"\s?" + _char_class(_DEEPSEEK_PUNCT_RANGES) + "+",
    r"\s+$",
    _char_class(_DEEPSEEK_CJK_RANGES) + "+",
    r"\p{N}+",
)
# Pres whose split is a list of regexes (each isolating its matches) ahead of a regex-free ByteLevel.
_SPLIT_REGEX_PRES = {
    "llama3": (_LLAMA3_SPLIT,), "llama-v3": (_LLAMA3_SPLIT,), "llama-bpe": (_LLAMA3_SPLIT,),
    "smaug-bpe": (_LLAMA3_SPLIT,), "qwen2": (_QWEN2_SPLIT,), "deepseek-r1-qwen": (_QWEN2_SPLIT,),
    "deepseek-llm": _DEEPSEEK_LLM_SPLITS, "tekken": (_TEKKEN_SPLIT,),
}
_FALCON_PRES = ("falcon",)


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable-char map (the alphabet byte-level BPE vocabularies are spelled in)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


@lru_cache(maxsize=1)
def _alphabet_to_byte() -> dict[str, int]:
    return {c: b for b, c in _byte_alphabet().items()}


def _byte_level(use_regex: bool = True):
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)


def _falcon_pre_tokenizer():
    """Falcon: punctuation runs apart, GPT-2's split, then digit runs cut into groups of three."""
    return pre_tokenizers.Sequence([
        pre_tokenizers.Punctuation(behavior="contiguous"),
        _byte_level(),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.Split(Regex("[0-9][0-9][0-9]"), behavior="isolated"),
    ])


def _pre_tokenizer_for(pre: str | None):
    """The pre-tokenizer of a byte-level BPE vocabulary, by its `tokenizer.ggml.pre` name."""
    if pre is None or pre in _GPT2_PRES or pre in _NFC_GPT2_PRES:
        return _byte_level()
    if pre in _DIGIT_PRES:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _byte_level()])
    if pre in _FALCON_PRES:
        return _falcon_pre_tokenizer()
    if pre in _SPLIT_REGEX_PRES:
        splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in _SPLIT_REGEX_PRES[pre]]
        return pre_tokenizers.Sequence(splits + [_byte_level(use_regex=False)])
    known = sorted(set(_GPT2_PRES + _DIGIT_PRES + _NFC_GPT2_PRES + _FALCON_PRES) | set(_SPLIT_REGEX_PRES))
    raise ValueError(f"GGUF tokenizer.ggml.pre={pre!r} is not supported; supported: {', '.join(known)}")


def _normalizer_for(pre: str | None):
    """The text normalizer a byte-level vocabulary needs before its pre-tokenizer (most need none)."""
    return normalizers.NFC() if pre in _NFC_PRES else None


class Tokenizer:
    """Text <-> token ids, chat templates, and streaming decode."""

    def __init__(self, backend: _HFTokenizer, *, bos_token_id: int | None = None,
                 eos_token_ids: Iterable[int] = (), pad_token_id: int | None = None,
                 unk_token_id: int | None = None, chat_template: str | None = None) -> None:
        self.backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_ids = list(dict.fromkeys(int(t) for t in eos_token_ids))  # dedupe, keep order
        self.pad_token_id = pad_token_id
        self.unk_token_id = unk_token_id
        self.chat_template = chat_template
        self.special_ids = frozenset(i for i, t in backend.get_added_tokens_decoder().items() if t.special)
        # Byte-level and SentencePiece byte-fallback vocabularies let streaming work on exact bytes
        # instead of guessing from text.
        self.byte_level = isinstance(backend.decoder, decoders.ByteLevel)
        # SentencePiece decoder: None if not one, else whether decoding drops the leading space.
        self.spm_strips_space = None if self.byte_level else tokenizer_spm.decoder_strip(backend.decoder)
        self._token_bytes: list[bytes] | None = None

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any], source: str = "GGUF") -> "Tokenizer":
        """Build from GGUF key/values (as returned by lowbit.gguf_reader.read_gguf_metadata)."""
        model = meta.get("tokenizer.ggml.model")
        if model is None or "tokenizer.ggml.tokens" not in meta:
            raise ValueError(f"{source}: no tokenizer in the GGUF metadata (tokenizer.ggml.model/tokens missing)")
        tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
        types = list(meta.get("tokenizer.ggml.token_type") or [])
        if model == "llama":
            backend = _sentencepiece_backend(meta, tokens, types, source)
        elif model == "gpt2":
            backend = _byte_level_backend(meta, tokens, types, source)
        else:
            raise NotImplementedError(
                f"{source}: GGUF tokenizer type {model!r} is not supported yet; supported: 'gpt2' (byte-level BPE), "
                f"'llama' (SentencePiece BPE). Use an HF directory with tokenizer.json instead.")

        bos = meta.get("tokenizer.ggml.bos_token_id")
        eos = [meta[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                 "tokenizer.ggml.eom_token_id") if meta.get(k) is not None]
        # llama.cpp adds BOS to a SentencePiece vocabulary unless the file says otherwise.
        add_bos = meta.get("tokenizer.ggml.add_bos_token", model == "llama")
        _set_post_processor(backend, tokens, bos if add_bos else None,
                            eos[0] if eos and meta.get("tokenizer.ggml.add_eos_token", False) else None)
        return cls(backend, bos_token_id=bos, eos_token_ids=eos,
                   pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
                   unk_token_id=meta.get("tokenizer.ggml.unknown_token_id"),
                   chat_template=meta.get("tokenizer.chat_template"))

    @classmethod
    def from_gguf(cls, path: str | Path) -> "Tokenizer":
        return cls.from_gguf_metadata(read_gguf_metadata(path), source=str(path))

    @classmethod
    def from_dir(cls, path: str | Path, eos_token_ids: Iterable[int] = ()) -> "Tokenizer":
        """Build from an HF directory: tokenizer.json (+ tokenizer_config.json, chat_template.jinja)."""
        path = Path(path)
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise FileNotFoundError(f"{path}: no tokenizer.json (lowbit needs the fast-tokenizer file)")
        try:
            backend = _HFTokenizer.from_file(str(tok_file))
        except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
            raise ValueError(f"{tok_file}: cannot parse tokenizer: {e}") from e
        cfg_file = path / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text(encoding="utf-8")) if cfg_file.is_file() else {}

        def token_id(name: str) -> int | None:
            tok = cfg.get(name)
            if isinstance(tok, dict):  # older configs store AddedToken dicts
                tok = tok.get("content")
            return backend.token_to_id(tok) if isinstance(tok, str) else None

        bos, eos = token_id("bos_token"), token_id("eos_token")
        if "add_bos_token" in cfg or "add_eos_token" in cfg:  # an explicit flag overrides tokenizer.json
            vocab_tokens = {i: backend.id_to_token(i) for i in (bos, eos) if i is not None}
            _set_post_processor(backend, vocab_tokens, bos if cfg.get("add_bos_token") else None,
                                eos if cfg.get("add_eos_token") else None)
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: use "default"
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        jinja_file = path / "chat_template.jinja"
        if jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        eos_ids = list(eos_token_ids) + ([eos] if eos is not None else [])
        return cls(backend, bos_token_id=bos, eos_token_ids=eos_ids, pad_token_id=token_id("pad_token"),
                   unk_token_id=token_id("unk_token"), chat_template=template)

    def save(self, directory: str | Path) -> None:
        """Write tokenizer.json + tokenizer_config.json (an HF-loadable pair)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(directory / "tokenizer.json"))
        # Record whether BOS/EOS get added (read off the post-processor: an empty text gets only those).
        marks = self.backend.encode("", add_special_tokens=True).ids
        eos = self.eos_token_ids[0] if self.eos_token_ids else None
        add_bos = self.bos_token_id is not None and marks[:1] == [self.bos_token_id]
        add_eos = eos is not None and marks[-1:] == [eos] and len(marks) > int(add_bos)
        cfg: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                               "add_bos_token": add_bos, "add_eos_token": add_eos}
        for name, tid in (("bos_token", self.bos_token_id), ("eos_token", self.eos_token_ids[0] if self.eos_token_ids else None),
                          ("pad_token", self.pad_token_id), ("unk_token", self.unk_token_id)):
            if tid is not None:
                cfg[name] = self.id_to_token(tid)
        if self.chat_template:
            cfg["chat_template"] = self.chat_template
        (directory / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False), encoding="utf-8")

    # ---------------------------------------------------------------- encode / decode
    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token(self) -> str | None:
        return None if self.bos_token_id is None else self.id_to_token(self.bos_token_id)

    @property
    def eos_token(self) -> str | None:
        return self.id_to_token(self.eos_token_ids[0]) if self.eos_token_ids else None

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(int(token_id))

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=add_special_tokens)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def decode_stream(self, skip_special_tokens: bool = False) -> "DecodeStream":
        return DecodeStream(self, skip_special_tokens)

    @property
    def exact_bytes(self) -> bool:
        """Whether every token stands for fixed bytes (byte-level BPE, or SentencePiece with byte fallback)."""
        return self.byte_level or self.spm_strips_space is not None

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes one token stands for (byte-level and SentencePiece vocabularies only).

        SentencePiece: before the decoder's one-leading-space strip, which applies to a whole text.
        """
        if not self.exact_bytes:
            raise ValueError("token_bytes needs a byte-level BPE or SentencePiece tokenizer")
        if self._token_bytes is None:
            to_byte = _alphabet_to_byte()
            table = []
            for i in range(self.vocab_size):
                tok = self.backend.id_to_token(i) or ""
                if not self.byte_level:
                    table.append(tokenizer_spm.piece_bytes(tok))
                # Same rule as the ByteLevel decoder: chars outside the alphabet (added tokens) pass as UTF-8.
                elif all(c in to_byte for c in tok):
                    table.append(bytes(to_byte[c] for c in tok))
                else:
                    table.append(tok.encode("utf-8"))
            self._token_bytes = table
        return self._token_bytes[token_id]

    # ---------------------------------------------------------------- chat
    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            chat_template: str | None = None, **kwargs: Any) -> str:
        template = chat_template or self.chat_template
        if template is None:
            raise ValueError("this model has no chat template; pass chat_template= or use plain prompts")
        variables = {"bos_token": self.bos_token, "eos_token": self.eos_token,
                     "pad_token": None if self.pad_token_id is None else self.id_to_token(self.pad_token_id),
                     "unk_token": None if self.unk_token_id is None else self.id_to_token(self.unk_token_id),
                     "tools": None, "documents": None}
        variables.update(kwargs)
        return _compile_template(template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **variables)

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    sanitize_control_tokens: bool = False, **kwargs: Any) -> list[int]:
        """Render the chat template and encode it; the template writes any BOS itself.

        sanitize_control_tokens: control tokens typed by the user (e.g. "<|im_end|>" inside a message)
        are encoded as plain text, so only the template can end a turn (transformers' option of the same name).
        """
        if not sanitize_control_tokens:
            text = self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **kwargs)
            return self.encode(text, add_special_tokens=False)
        control = sorted((self.id_to_token(i) for i in self.special_ids), key=len, reverse=True)
        pattern = re.compile("|".join(map(re.escape, control)) or "(?!)")
        marked_messages, marked_kwargs = _mark(messages, pattern), _mark(kwargs, pattern)
        text = self.apply_chat_template(marked_messages, add_generation_prompt=add_generation_prompt, **marked_kwargs)
        # Pieces alternate: template text, user-typed control token, template text, ...
        pieces = re.split(f"{_MARK_START}(.*?){_MARK_END}|[{_MARK_START}{_MARK_END}]", text, flags=re.S)
        ids: list[int] = []
        newline = self.encode("\n", add_special_tokens=False)
        for k, piece in enumerate(pieces):
            if not piece:
                continue
            encode = self._encode_plain if k % 2 else (lambda t: self.encode(t, add_special_tokens=False))
            if k == 0:
                piece_ids = encode(piece)
            else:
                # A piece from mid-text: encode it after a newline and drop that again, so SentencePiece
                # does not give it the prefix space of a text start (transformers does the same).
                piece_ids = encode("\n" + piece)
                piece_ids = piece_ids[len(newline):] if piece_ids[:len(newline)] == newline else encode(piece)
            if k % 2 and self.token_to_id(piece) in piece_ids:
                raise ValueError(f"cannot sanitize {piece!r}: plain text encodes to the control token itself")
            ids += piece_ids
        return ids

    def _encode_plain(self, text: str) -> list[int]:
        """Encode without matching added/special tokens: the backend pipeline minus its added-token pass."""
        b = self.backend
        if b.normalizer is not None:
            text = b.normalizer.normalize_str(text)
        splits = [p for p, _ in b.pre_tokenizer.pre_tokenize_str(text)] if b.pre_tokenizer is not None else [text]
        return [t.id for p in splits for t in b.model.tokenize(p)]


class DecodeStream:
    """Turns token ids into text pieces as they arrive, never emitting half a UTF-8 character.

    Byte-level and SentencePiece tokenizers: feed each token's exact bytes (a `<0xNN>` byte-fallback
    piece is one byte) to an incremental UTF-8 decoder; bytes that can never form a character come
    out as U+FFFD once that is certain. For valid UTF-8 the pieces join to exactly `decode(ids)`;
    an invalid byte-fallback run gives one U+FFFD per maximal bad subsequence, where `decode`
    gives one per byte of the run. Others: tokenizers' own DecodeStream, which holds text back while
    it ends in a partial character.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        if tokenizer.exact_bytes:
            self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
            # SentencePiece decoding drops one space at the very start of the text (the added prefix).
            self._strip_first_space = bool(tokenizer.spm_strips_space)
        else:
            self._inner = decoders.DecodeStream(skip_special_tokens=skip_special_tokens)

    def step(self, token_id: int) -> str:
        """Text made complete by this token ("" when it only started a multi-byte character)."""
        token_id = int(token_id)
        if not self._tok.exact_bytes:
            return self._inner.step(self._tok.backend, token_id) or ""
        if self._skip and token_id in self._tok.special_ids:
            return ""
        data = self._tok.token_bytes(token_id)
        if self._strip_first_space and data:
            self._strip_first_space = False
            data = data[1:] if data[:1] == b" " else data
        return self._utf8.decode(data)

    def flush(self) -> str:
        """Whatever is held back at the end of generation (an incomplete character becomes U+FFFD)."""
        return self._utf8.decode(b"", final=True) if self._tok.exact_bytes else ""


def _byte_level_backend(meta: dict[str, Any], tokens: list[str], types: list[int], source: str) -> _HFTokenizer:
    """GGUF `gpt2` tokenizer: byte-level BPE from the stored merges."""
    merges = meta.get("tokenizer.ggml.merges")
    if merges is None:
        raise ValueError(f"{source}: byte-level BPE tokenizer without tokenizer.ggml.merges")
    alphabet = set(_byte_alphabet().values())
    spell = _byte_alphabet()
    # Tokens are normally stored in the byte alphabet already; respell any that are not.
    vocab = {(t if set(t) <= alphabet else "".join(spell[b] for b in t.encode("utf-8"))): i
             for i, t in enumerate(tokens)}
    bpe = BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges], dropout=None,
              continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    backend = _HFTokenizer(bpe)
    pre = meta.get("tokenizer.ggml.pre")
    backend.pre_tokenizer = _pre_tokenizer_for(pre)
    normalizer = _normalizer_for(pre)
    if normalizer is not None:
        backend.normalizer = normalizer
    backend.decoder = decoders.ByteLevel()
    # Control tokens become special; a "control" token spelled outside the byte alphabet is a
    # llama.cpp mislabel that would grow the vocabulary, so (like transformers) skip it.
    control = [AddedToken(t, normalized=False, special=True)
               for t, ty in zip(tokens, types) if ty == _CONTROL and set(t) <= alphabet]
    if control:
        backend.add_special_tokens(control)
    user = [AddedToken(t, normalized=False, special=False)
            for t, ty in zip(tokens, types) if ty == _USER_DEFINED and t in vocab]
    if user:
        backend.add_tokens(user)
    return backend


# Architectures whose SentencePiece vocabularies are built differently (Gemma spells space runs as
# real spaces and ranks merges by position).
_SPM_OTHER_SPACE_RULES = ("gemma", "gemma2", "gemma3")
# Phi-3's tokenizer.json: its control tokens eat the whitespace after them (rstrip), except these.
_PHI3_NO_RSTRIP = ("<unk>", "<s>", "<|endoftext|>")


def _sentencepiece_backend(meta: dict[str, Any], tokens: list[str], types: list[int], source: str) -> _HFTokenizer:
    """GGUF `llama` tokenizer: SentencePiece BPE from pieces + scores (merges recovered from the scores)."""
    arch = meta.get("general.architecture")
    if arch in _SPM_OTHER_SPACE_RULES:
        raise NotImplementedError(
            f"{source}: SentencePiece tokenizer of a {arch!r} model is not supported (its space handling differs "
            f"from Llama's); use an HF directory with tokenizer.json instead")
    scores = meta.get("tokenizer.ggml.scores")
    if scores is None or len(scores) != len(tokens):
        raise ValueError(f"{source}: SentencePiece tokenizer needs tokenizer.ggml.scores, one per token "
                         f"({len(tokens)} tokens, {'no' if scores is None else len(scores)} scores)")
    backend = tokenizer_spm.build_backend(tokens, scores, meta.get("tokenizer.ggml.add_space_prefix", True))
    # Control tokens and the named specials (BOS/EOS/UNK/PAD, e.g. "<unk>" whose type is UNKNOWN) are
    # matched whole and dropped by skip_special_tokens; user-defined tokens are matched whole.
    named = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "unknown", "padding")]
    special = {i for i, ty in enumerate(types) if ty == _CONTROL} | {i for i in named if i is not None}
    for i in sorted(special):
        if not 0 <= i < len(tokens):
            raise ValueError(f"{source}: special token id {i} is outside the vocabulary of {len(tokens)} tokens")
    if special:
        backend.add_special_tokens([
            AddedToken(tokens[i], normalized=False, special=True,
                       rstrip=arch == "phi3" and tokens[i] not in _PHI3_NO_RSTRIP)
            for i in sorted(special)])
    user = [AddedToken(t, normalized=False, special=False)
            for i, (t, ty) in enumerate(zip(tokens, types)) if ty == _USER_DEFINED and i not in special]
    if user:
        backend.add_tokens(user)
    return backend


# Private-use code points (the ones transformers uses) that wrap user-typed control tokens while rendering.
_MARK_START, _MARK_END = "\U000f0000", "\U000f0001"


def _mark(obj: Any, pattern: "re.Pattern[str]") -> Any:
    """Wrap control tokens found in user strings (recursively; dict keys untouched) in the private markers."""
    if isinstance(obj, str):
        obj = obj.replace(_MARK_START, "").replace(_MARK_END, "")  # markers cannot be forged
        return pattern.sub(lambda m: f"{_MARK_START}{m.group(0)}{_MARK_END}", obj)
    if isinstance(obj, dict):
        return {k: _mark(v, pattern) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_mark(v, pattern) for v in obj]
    return obj


def _set_post_processor(backend: _HFTokenizer, tokens, bos: int | None, eos: int | None) -> None:
    """BOS/EOS insertion as a TemplateProcessing, like transformers' update_post_processor."""
    single = ([f"{tokens[bos]}:0"] if bos is not None else []) + ["$A:0"] + ([f"{tokens[eos]}:0"] if eos is not None else [])
    pair = single + ([f"{tokens[bos]}:1"] if bos is not None else []) + ["$B:1"] + ([f"{tokens[eos]}:1"] if eos is not None else [])
    specials = [(tokens[i], i) for i in (bos, eos) if i is not None]
    backend.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


@lru_cache(maxsize=16)
def _compile_template(template: str):
    """Compile a chat template in the same sandbox, with the same helpers, as transformers."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja's own tojson HTML-escapes; chat templates expect plain JSON.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    class GenerationTag(jinja2.ext.Extension):
        # `{% generation %}...{% endgeneration %}` marks assistant text for training masks; render it as-is.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template)
