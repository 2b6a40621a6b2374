"""SentencePiece-BPE GGUF tokenizers (tokenizer.ggml.model == "llama") against transformers' GGUF loader.

No Llama-2 GGUF is needed: each test file is written here, llama.cpp style, from a small vocabulary
trained on CORPUS (byte-fallback pieces <0x00>..<0xFF>, "<unk>", "<s>", "</s>", merged pieces with
scores), and transformers reads the very same file.
"""
import collections
import importlib
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def _import(name):
    """The installed lowbit's module `name` (the tests never import the source tree)."""
    return importlib.import_module(name)


Tokenizer = _import("lowbit.tokenizer").Tokenizer
spm = _import("lowbit.tokenizer_spm")

CORPUS = """The quick brown fox jumps over the lazy dog. A tokenizer turns text into pieces, and pieces into ids.
Hello world! Hello there, my friend. It's 2024 and the numbers 1234567890 appear often: 3.14, 42, 100%.
def main():
    for i in range(10):
        print("hello", i)
    return None
Café, naïve, résumé, über -- accents are common in European text. The end of the line.
"""

TEXTS = [
    "", " ", "  ", "   ", "hello", " hello", "  hello", "hello ", "Hello world", "Hello, world!", "a  b   c    d",
    "The quick brown fox", " The end", "tabs\tand\ttabs", "line1\nline2\n\nline4\r\nwin", "\n", "\n\n\nx",
    "   leading and trailing   ", "1234567890 3.14159 1e-5 0x1F", "2024-11-22", "Café naïve résumé",
    "日本語のテキスト", "中文和English混合", "emoji 🎉🚀 done", "🤖", "Ünïcödé ñ", "€100 £50", "zero\x00byte",
    "def f(x):\n    return x ** 2\n", "    indented", "don't won't it's", "<s>", "</s>", "<s>hi</s>", "a<unk>b",
    "<s> spaced </s> out", "x<|ctl|>y", "think: <think>deep</think>", "<0x41>", "\u00a0nbsp", "a\u200bb",
    "▁already▁spaced", "QUICK BROWN", "¿Qué? ¡Sí!",
]


# ------------------------------------------------------------------ synthetic SentencePiece GGUF
def _train_pieces(corpus, n_merges):
    """A tiny BPE trainer on "▁"-prefixed words: the merged pieces in the order they were learned."""
    words = collections.Counter("\u2581" + w for line in corpus.splitlines() for w in line.split(" "))
    spelled = {w: list(w) for w in words}
    learned = []
    for _ in range(n_merges):
        pairs = collections.Counter()
        for w, n in words.items():
            for a, b in zip(spelled[w], spelled[w][1:]):
                pairs[a, b] += n
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        learned.append(a + b)
        for w, s in spelled.items():
            out, i = [], 0
            while i < len(s):
                if s[i:i + 2] == [a, b]:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            spelled[w] = out
    chars = sorted({c for w in words for c in w})
    return learned, chars


def spm_vocab():
    """Llama-2 layout: <unk>, <s>, </s>, 256 byte pieces, merged pieces (best score first), characters,
    then a control token and two user-defined tokens. Merged pieces share scores in pairs so the
    tie order of the recovered merges matters."""
    learned, chars = _train_pieces(CORPUS, 250)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    for i, piece in enumerate(p for p in learned if p not in chars):
        tokens.append(piece), types.append(1), scores.append(-float(i // 2))
    for j, c in enumerate(chars):
        tokens.append(c), types.append(1), scores.append(-1000.0 - j)
    for extra, ty in (("<|ctl|>", 3), ("<think>", 4), ("</think>", 4)):
        tokens.append(extra), types.append(ty), scores.append(0.0)
    return tokens, scores, types


# Llama-2's chat template shape: the template writes BOS/EOS itself.
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
                 "{{ '[INST] ' + m['content'] + ' [/INST]' }}{% else %}{{ ' ' + m['content'] + eos_token }}"
                 "{% endif %}{% endfor %}")


def write_spm_gguf(directory, **flags):
    """A llama-arch GGUF with an SPM vocabulary; flags: add_bos, add_eos, add_space_prefix, pad_id."""
    tokens, scores, types = spm_vocab()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "spm.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(4)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_chat_template(CHAT_TEMPLATE)
    if "pad_id" in flags:
        w.add_pad_token_id(flags["pad_id"])
    if "add_bos" in flags:
        w.add_add_bos_token(flags["add_bos"])
    if "add_eos" in flags:
        w.add_add_eos_token(flags["add_eos"])
    if "add_space_prefix" in flags:
        w.add_add_space_prefix(flags["add_space_prefix"])
    w.add_tensor("token_embd.weight", np.random.default_rng(0).standard_normal((len(tokens), 8)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _pair(path):
    """lowbit and transformers on one file. transformers' GGUF loader adds the prefix "▁" with a Metaspace
    pre-tokenizer, which skips it when the text already starts with a space; Llama-2's own tokenizer.json
    (and sentencepiece, see test_tokenizer_reference.py) always adds it, in a normalizer: the reference gets that."""
    from tokenizers import normalizers
    ours = Tokenizer.from_gguf(path)
    theirs = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    backend = theirs.backend_tokenizer
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    backend.pre_tokenizer = None
    return ours, theirs


# Files written once per module: the default (no flags: BOS by default), and flag variants.
VARIANTS = {
    "default": {},
    "no_bos_with_eos": {"add_bos": False, "add_eos": True},
    "explicit_bos_pad": {"add_bos": True, "pad_id": 2},
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("spm")
    return {name: write_spm_gguf(root / name, **flags) for name, flags in VARIANTS.items()}


@pytest.fixture(scope="module")
def pair(files):
    return _pair(files["default"])


def _gpl_text():
    path = SHARED / "data" / "eval" / "gpl-3.txt"
    if not path.is_file():
        pytest.skip(f"shared data not found: {path}")
    return path.read_text(encoding="utf-8")[:20000]


# ------------------------------------------------------------------ merges recovered from scores
def test_merges_from_scores_hand_example():
    tokens = ["a", "b", "c", "ab", "bc", "abc", "ca"]
    scores = [-10.0, -11.0, -12.0, -1.0, -1.0, -0.5, -3.0]
    # "abc" (best score) splits as a|bc and ab|c: the longer left part first. Then the tie between
    # "ab" and "bc" (same score, same lengths) keeps vocabulary order; "ca" last.
    assert spm.merges_from_scores(tokens, scores) == [("ab", "c"), ("a", "bc"), ("a", "b"), ("b", "c"), ("c", "a")]


def test_merges_from_scores_match_transformers_generate_merges():
    from transformers.tokenization_utils_base import generate_merges
    tokens, scores, _ = spm_vocab()
    rng = np.random.default_rng(1)
    for trial in range(3):  # the real scores, then coarse random scores full of ties
        if trial:
            scores = list(rng.integers(-5, 0, len(tokens)).astype(float))
        expected = generate_merges({t: i for i, t in enumerate(tokens)}, dict(zip(tokens, scores)))
        got = spm.merges_from_scores(tokens, scores)
        assert len(got) > 200
        assert got == expected


# ------------------------------------------------------------------ against transformers
def test_vocab_and_special_ids(pair):
    ours, theirs = pair
    assert ours.vocab_size == len(theirs) == len(spm_vocab()[0])
    assert (ours.bos_token_id, ours.eos_token_ids, ours.unk_token_id) == (1, [2], 0)
    assert ours.bos_token == "<s>" and ours.eos_token == "</s>"
    # <unk> (type UNKNOWN), <s>, </s> and the control token are special; user-defined <think> is not.
    ctl = ours.token_to_id("<|ctl|>")
    assert ours.special_ids == {0, 1, 2, ctl}
    assert set(ours.special_ids) == set(theirs.all_special_ids) | {ctl}
    assert ours.spm_strips_space is True and not ours.byte_level


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_encode_decode_match_transformers(files, variant):
    ours, theirs = _pair(files[variant])
    for text in TEXTS:
        for special in (True, False):
            ids = ours.encode(text, add_special_tokens=special)
            assert ids == theirs.encode(text, add_special_tokens=special), (variant, text, special)
        for skip in (False, True):
            assert ours.decode(ids) == theirs.decode(ids), (variant, text)
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip), text
    assert ours.encode_batch(TEXTS) == [theirs.encode(t) for t in TEXTS]


def test_bos_eos_flags(files):
    default = Tokenizer.from_gguf(files["default"])
    hello = default.encode("Hello", add_special_tokens=False)
    assert default.encode("Hello") == [1] + hello  # no add_bos_token key: BOS, as llama.cpp does for SPM
    assert default.encode("") == [1] and default.encode("", add_special_tokens=False) == []
    flipped = Tokenizer.from_gguf(files["no_bos_with_eos"])
    assert flipped.encode("Hello") == hello + [2]
    assert Tokenizer.from_gguf(files["explicit_bos_pad"]).pad_token_id == 2


def test_long_text_matches_transformers(pair):
    ours, theirs = pair
    text = _gpl_text()
    ids = ours.encode(text)
    assert ids == theirs.encode(text)
    assert len(ids) > 5000
    assert ours.decode(ids) == theirs.decode(ids)
    # Byte fallback makes every text round-trip, a leading space included: the prefix "▁" is added
    # even before a space, and decoding strips just that one.
    assert text.startswith(" ") and ours.decode(ids, skip_special_tokens=True) == text
    assert ours.decode(ours.encode(text.lstrip())) == "<s>" + " " + text.lstrip()


def test_chat_matches_transformers(pair):
    ours, theirs = pair
    conv = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi! 日本"},
            {"role": "user", "content": "  two spaces\nand </s> typed"}]
    rendered = ours.apply_chat_template(conv)
    assert rendered == theirs.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    ids = ours.encode_chat(conv)
    assert ids == list(theirs.apply_chat_template(conv, tokenize=True, add_generation_prompt=True, return_dict=False))
    assert ids.count(1) == 1 and ids[0] == 1  # the template's BOS only, none added on top
    sanitized = ours.encode_chat(conv, sanitize_control_tokens=True)
    assert ids.count(2) == 2 and sanitized.count(2) == 1  # the typed "</s>" no longer ends a turn
    for typed in ("</s>", "<s>hi", "x</s>", "<|ctl|> <s>\n</s>", " </s> ", "日</s>本"):
        conv[-1]["content"] = typed  # control tokens at the start, end, alone, after spaces and bytes
        expected = theirs.apply_chat_template(conv, tokenize=True, add_generation_prompt=True,
                                              return_dict=False, sanitize_control_tokens=True)
        assert ours.encode_chat(conv, sanitize_control_tokens=True) == list(expected), typed
        assert ours.encode_chat(conv) == list(theirs.apply_chat_template(
            conv, tokenize=True, add_generation_prompt=True, return_dict=False)), typed


# ------------------------------------------------------------------ pieces, spaces, byte fallback
def test_spaces_become_pieces_with_one_prefix(pair):
    ours, _ = pair
    pieces = lambda text: [ours.id_to_token(i) for i in ours.encode(text, add_special_tokens=False)]
    assert pieces("Hello world") == ["▁Hello", "▁world"]
    assert pieces(" Hello") == ["▁", "▁Hello"]  # the prefix "▁" comes on top of the typed space
    assert "".join(pieces("a  b")) == "▁a▁▁b"
    assert "".join(pieces("line\nnext")) == "▁line<0x0A>next"  # "\n" is not a piece: byte fallback


def test_byte_fallback_spells_utf8_bytes(pair):
    ours, _ = pair
    byte_id = {f"<0x{b:02X}>": ours.token_to_id(f"<0x{b:02X}>") for b in range(256)}
    for ch in "日🎉€\x00":
        ids = ours.encode(ch, add_special_tokens=False)
        expected = [ours.token_to_id("▁")] + [byte_id[f"<0x{b:02X}>"] for b in ch.encode("utf-8")]
        assert ids == expected, ch
        assert ours.decode(ids) == ch
    assert [ours.token_bytes(i) for i in ours.encode("é", add_special_tokens=False)] == [b" ", b"\xc3\xa9"]


def test_control_and_user_tokens_stay_whole(pair):
    ours, _ = pair
    ctl, think = ours.token_to_id("<|ctl|>"), ours.token_to_id("<think>")
    ids = ours.encode("x<|ctl|>y<think>z", add_special_tokens=False)
    assert ctl in ids and think in ids
    # User-defined tokens are not special. Text after an added token is a new run and gets its own
    # prefix "▁" (sentencepiece encodes each run on its own, as llama.cpp and Llama-2's tokenizer.json do).
    assert ours.decode(ids, skip_special_tokens=True) == "x y<think> z"


def test_space_prefix_off_follows_the_flag(tmp_path):
    # transformers' GGUF loader ignores add_space_prefix; llama.cpp honours it, and so do we. Reference:
    # transformers' own LlamaTokenizer built from the same pieces with add_prefix_space=False.
    from transformers import LlamaTokenizer
    from transformers.tokenization_utils_base import generate_merges
    path = write_spm_gguf(tmp_path, add_space_prefix=False)
    ours = Tokenizer.from_gguf(path)
    tokens, scores, _ = spm_vocab()
    ref = LlamaTokenizer(vocab={t: i for i, t in enumerate(tokens)}, add_prefix_space=False,
                         merges=generate_merges({t: i for i, t in enumerate(tokens)}, dict(zip(tokens, scores))))
    assert ours.spm_strips_space is False
    assert ours.id_to_token(ours.encode("Hello", add_special_tokens=False)[0]) != "▁Hello"
    for text in TEXTS:
        if "<" in text:  # the reference has no added tokens
            continue
        ids = ours.encode(text, add_special_tokens=False)
        assert ids == ref.encode(text, add_special_tokens=False), repr(text)
        assert ours.decode(ids) == ref.decode(ids), repr(text)
        if "\u2581" not in text:  # a typed "▁" decodes as a space
            assert ours.decode(ours.encode(text), skip_special_tokens=True) == text, repr(text)


# ------------------------------------------------------------------ streaming decode
def _stream(tok, ids, skip=False):
    stream = tok.decode_stream(skip_special_tokens=skip)
    pieces = [stream.step(i) for i in ids]
    return pieces, "".join(pieces) + stream.flush()


def test_decode_stream_joins_to_decode(pair):
    ours, _ = pair
    for text in TEXTS + [_gpl_text()[:3000]]:
        ids = ours.encode(text)
        for skip in (False, True):
            pieces, joined = _stream(ours, ids, skip)
            assert joined == ours.decode(ids, skip_special_tokens=skip), (text, skip)
            assert all("\ufffd" not in p for p in pieces), text


def test_decode_stream_holds_partial_byte_fallback_characters(pair):
    ours, _ = pair
    ids = ours.encode("🎉日", add_special_tokens=False)  # ▁ + 4 + 3 byte pieces
    assert len(ids) == 8
    pieces, joined = _stream(ours, ids)
    assert pieces == ["", "", "", "", "🎉", "", "", "日"]  # the leading "▁" is the stripped prefix
    assert joined == "🎉日"
    stream = ours.decode_stream()  # cut in the middle of a character: one U+FFFD, no mojibake
    assert [stream.step(i) for i in ids[:3]] == ["", "", ""] and stream.flush() == "\ufffd"


def test_decode_stream_strips_only_the_first_space(pair):
    ours, _ = pair
    ids = ours.encode("Hello world")  # [<s>, ▁Hello, ▁world]
    assert _stream(ours, ids)[0] == ["<s>", " Hello", " world"]  # after a kept <s> the space stays
    assert _stream(ours, ids, skip=True)[0] == ["", "Hello", " world"]
    assert _stream(ours, ids[1:])[0] == ["Hello", " world"]


def test_decode_stream_invalid_bytes_become_replacement(pair):
    ours, _ = pair
    ff, e6, a = ours.token_to_id("<0xFF>"), ours.token_to_id("<0xE6>"), ours.token_to_id("a")
    assert _stream(ours, [ff, a])[1] == "\ufffda" == ours.decode([ff, a])
    assert _stream(ours, [e6, a])[0] == ["", "\ufffda"]


# ------------------------------------------------------------------ tokenizer.json round trip
def test_save_and_reload_keeps_bos_and_streaming(pair, tmp_path):
    ours, _ = pair
    ours.save(tmp_path)
    again = Tokenizer.from_dir(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for text in TEXTS:
        assert again.encode(text) == ours.encode(text) == hf.encode(text), repr(text)
        assert hf.decode(ours.encode(text)) == ours.decode(ours.encode(text)), repr(text)
    assert again.spm_strips_space is True
    assert _stream(again, ours.encode("日本🎉"))[1] == "<s> 日本🎉"


# ------------------------------------------------------------------ bad metadata
def _meta(**over):
    tokens, scores, types = spm_vocab()
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}
    meta.update(over)
    return {k: v for k, v in meta.items() if v is not None}


def test_bad_metadata_is_named():
    assert Tokenizer.from_gguf_metadata(_meta()).encode("hi")[0] == 1
    with pytest.raises(ValueError, match="tokenizer.ggml.scores.*no scores"):
        Tokenizer.from_gguf_metadata(_meta(**{"tokenizer.ggml.scores": None}), source="m.gguf")
    with pytest.raises(ValueError, match=r"m.gguf: .*\(\d+ tokens, 3 scores\)"):
        Tokenizer.from_gguf_metadata(_meta(**{"tokenizer.ggml.scores": [0.0] * 3}), source="m.gguf")
    with pytest.raises(ValueError, match="special token id 99999 is outside the vocabulary"):
        Tokenizer.from_gguf_metadata(_meta(**{"tokenizer.ggml.eos_token_id": 99999}))
    with pytest.raises(NotImplementedError, match="m.gguf: .*'gemma' model is not supported"):
        Tokenizer.from_gguf_metadata(_meta(**{"general.architecture": "gemma"}), source="m.gguf")
    assert Tokenizer.from_gguf_metadata(_meta(**{"general.architecture": "llama"})).vocab_size == len(spm_vocab()[0])
    with pytest.raises(NotImplementedError, match="'t5'.*'llama'"):
        Tokenizer.from_gguf_metadata(_meta(**{"tokenizer.ggml.model": "t5"}))
