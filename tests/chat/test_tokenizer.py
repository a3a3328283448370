"""Tokenizers: the real Qwen3 one (oracle: tiktoken on the same ranks, known ids) and the compact one."""

import json
import unicodedata

import pytest
import tiktoken
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from reagent_jax import chat
from reagent_jax.chat import tokenizer as tokenizer_mod
from reagent_jax.chat import vocab

ROUND_TRIP_SAMPLES = [
    "Hello world!",
    "日本語のテキストと中文句子，한국어 문장。",
    "Emoji: 😀🎉👩‍👩‍👧‍👦 🇯🇵 and symbols ∑∫√π ≠ ≤",
    "Accents: café naïve façade Ærøskøbing Đorđe São Paulo Zürich",
    "Arabic مرحبا بالعالم and Hindi नमस्ते दुनिया",
    "def f(x: int) -> int:\n\treturn x ** 2  # square\n\n\nclass A:\n    pass\n",
    'if (a && b) { printf("%d\\n", a[i]); } // C-ish\r\n',
    "  leading and trailing spaces   ",
    "\t\ttabs\tand\t\tmore tabs\t",
    "multiple\n\n\n\nnewlines\n \n  \n",
    "trailing spaces   \nline two  \n\n",
    "numbers 1234567890 3.14159e-10 0x1F",
    "it's they're we've I'm you'll he'd IT'S",
    "<|im_start|>user\nhi<|im_end|>\n<think>\nx\n</think>\n\n<tool_call>\n{}\n</tool_call>",
    "Bidi: \u202eevil\u202c \u2067שלום\u2069 \u200e\u200f\u061c",
    "Controls: \x00\x01\x07\x08\x0b\x0c\x1b[31m\x7f\x85\u2028\u2029 NUL\x00",
    "Whitespace runs: " + " " * 3000 + "\n" * 300 + "\t" * 100 + "\r\n" * 50 + "\u3000\u00a0end",
    "Marks: Z\u0336\u0337a\u0338 \u0915\u094d\u0937 \u1100x \ufeff \U0001F3F3\uFE0F\u200D\U0001F308",
    "Private/nonchar: \ue000\U0010fffd\ufffe\uffff \U0001d518\ufffd",
]


@pytest.fixture(scope="module")
def qwen_tok():
    return chat.load_tokenizer(None)


@pytest.fixture(scope="module")
def tiktoken_oracle():
    ranks = tokenizer_mod.read_tiktoken_ranks(tokenizer_mod.qwen_tiktoken_path())
    return tiktoken.Encoding("qwen_oracle", pat_str=vocab.QWEN2_PRETOKENIZE_REGEX,
                             mergeable_ranks=ranks, special_tokens=dict(vocab.QWEN3_SPECIAL_TOKEN_IDS))


def test_known_encodings(qwen_tok):
    assert isinstance(qwen_tok, PreTrainedTokenizerFast)
    assert qwen_tok.encode("Hello world!", add_special_tokens=False) == [9707, 1879, 0]
    assert len(qwen_tok) == 151669 <= chat.QWEN3_MODEL_VOCAB_SIZE == 151936
    assert len(vocab.QWEN3_ADDED_TOKENS) == 26
    for token, token_id, _ in vocab.QWEN3_ADDED_TOKENS:
        assert qwen_tok.encode(token, add_special_tokens=False) == [token_id], token
        assert qwen_tok.convert_ids_to_tokens(token_id) == token
    assert (qwen_tok.eos_token, qwen_tok.eos_token_id) == ("<|im_end|>", 151645)
    assert (qwen_tok.pad_token, qwen_tok.pad_token_id) == ("<|endoftext|>", 151643)
    assert qwen_tok.bos_token is None
    # Control tokens are never glued to neighbouring text.
    assert qwen_tok.encode("a<|im_start|>b<think>c", add_special_tokens=False) == [
        64, 151644, 65, 151667, 66]


def test_one_merge_per_non_byte_token(qwen_tok):
    model = json.loads(qwen_tok.backend_tokenizer.to_str())["model"]
    assert model["type"] == "BPE" and not model["byte_fallback"]
    assert len(model["vocab"]) == 151643
    assert len(model["merges"]) == 151643 - 256  # 151,387, as in Qwen2's merges.txt


def test_matches_tiktoken_on_the_same_ranks(qwen_tok, tiktoken_oracle):
    corpus = ROUND_TRIP_SAMPLES + [chat.QWEN3_CHAT_TEMPLATE, open(json.__file__).read()[:20000]]
    for text in corpus:
        ours = qwen_tok.encode(text, add_special_tokens=False)
        assert ours == tiktoken_oracle.encode(text, allowed_special="all"), text[:60]


@pytest.mark.parametrize("text", ROUND_TRIP_SAMPLES)
def test_decode_encode_round_trip(qwen_tok, text):
    ids = qwen_tok.encode(text, add_special_tokens=False)
    assert qwen_tok.decode(ids) == text


def test_skip_special_tokens_follows_qwen3_flags(qwen_tok):
    ids = qwen_tok.encode("<|im_start|>assistant\n<think>\nr\n</think>\n\n<tool_call>\n{}\n"
                          "</tool_call><|im_end|><|endoftext|>", add_special_tokens=False)
    # Qwen3 keeps <think>/<tool_call> as ordinary added tokens: they survive skip_special_tokens.
    assert qwen_tok.decode(ids, skip_special_tokens=True) == (
        "assistant\n<think>\nr\n</think>\n\n<tool_call>\n{}\n</tool_call>")


@pytest.mark.parametrize("text", ["cafe\u0301", "a\u0323\u0301\u0308", "a\u0301\u0323",
                                  "\u212b \u2126 \u212a", "\u1100\u1161\u11a8", "q\u0307\u0323"])
def test_input_is_nfc_normalized(qwen_tok, text):
    # Like Qwen3's own tokenizer.json (normalizer NFC): non-NFC text comes back composed.
    assert not unicodedata.is_normalized("NFC", text)
    ids = qwen_tok.encode(text, add_special_tokens=False)
    assert qwen_tok.decode(ids) == unicodedata.normalize("NFC", text)
    assert ids == qwen_tok.encode(unicodedata.normalize("NFC", text), add_special_tokens=False)


def test_save_load_round_trip(qwen_tok, tmp_path):
    qwen_tok.save_pretrained(tmp_path)
    reloaded = [chat.load_tokenizer(tmp_path), AutoTokenizer.from_pretrained(str(tmp_path))]
    for tok in reloaded:
        assert isinstance(tok, PreTrainedTokenizerFast)
        assert len(tok) == len(qwen_tok)
        assert (tok.eos_token_id, tok.pad_token_id) == (151645, 151643)
        assert tok.chat_template == chat.QWEN3_CHAT_TEMPLATE
        for text in ROUND_TRIP_SAMPLES:
            assert tok.encode(text, add_special_tokens=False) == qwen_tok.encode(
                text, add_special_tokens=False)


def test_loads_a_qwen3_checkpoint_style_directory(qwen_tok, tmp_path):
    # Real Qwen3 checkpoints name Qwen2Tokenizer in tokenizer_config.json.
    qwen_tok.save_pretrained(tmp_path)
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "Qwen2Tokenizer"
    config_path.write_text(json.dumps(config))
    tok = chat.load_tokenizer(tmp_path)
    assert type(tok).__name__ == "Qwen2Tokenizer" and isinstance(tok, PreTrainedTokenizerFast)
    for text in ROUND_TRIP_SAMPLES:
        assert tok.encode(text, add_special_tokens=False) == qwen_tok.encode(
            text, add_special_tokens=False)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert chat.render(tok, messages).ids == chat.render(qwen_tok, messages).ids


def test_disk_cache_is_used(qwen_tok):
    cached = list(tokenizer_mod.cache_root().glob(f"qwen3_tokenizer-v{tokenizer_mod._BUILD_VERSION}-*"))
    assert any((d / "tokenizer.json").is_file() for d in cached)


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        chat.load_tokenizer(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        chat.load_tokenizer(tmp_path)
    plain = Tokenizer(WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]"))
    PreTrainedTokenizerFast(tokenizer_object=plain, unk_token="[UNK]").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="<\\|im_start\\|>"):
        chat.load_tokenizer(tmp_path)


def test_read_tiktoken_ranks_rejects_bad_files(tmp_path):
    bad = tmp_path / "bad.tiktoken"
    bad.write_bytes(b"SGVsbG8= 0\nnot-a-line\n")
    with pytest.raises(ValueError, match="bad.tiktoken:2"):
        tokenizer_mod.read_tiktoken_ranks(bad)
    gap = tmp_path / "gap.tiktoken"
    gap.write_bytes(b"YQ== 0\nYg== 2\n")
    with pytest.raises(ValueError, match="permutation"):
        tokenizer_mod.read_tiktoken_ranks(gap)


# ---- compact tokenizer ---------------------------------------------------------------------

COMPACT_TEXTS = [
    "Question: what is 12 + 30? Answer: \\boxed{42}",
    "Search the knowledge base for the capital of France. The capital of France is Paris.",
    "The python tool prints results: print(sum(range(10)))",
] * 10


@pytest.fixture(scope="module")
def compact_tok():
    return chat.build_compact_tokenizer(COMPACT_TEXTS, vocab_size=400)


def test_compact_has_control_tokens_first(compact_tok, qwen_tok):
    assert type(compact_tok) is type(qwen_tok)  # interchangeable everywhere
    for i, (token, _, _) in enumerate(vocab.QWEN3_ADDED_TOKENS):
        assert compact_tok.encode(token, add_special_tokens=False) == [i]
    assert (compact_tok.eos_token_id, compact_tok.pad_token_id) == (2, 0)
    assert 282 < len(compact_tok) <= 400


def test_compact_encodes_any_text_and_compresses(compact_tok):
    for text in ROUND_TRIP_SAMPLES:  # mostly unseen scripts: byte-level covers them
        assert compact_tok.decode(compact_tok.encode(text, add_special_tokens=False)) == text
    seen = COMPACT_TEXTS[1]
    assert len(compact_tok.encode(seen, add_special_tokens=False)) < len(seen.encode()) / 2


def test_compact_is_deterministic_and_round_trips(compact_tok, tmp_path):
    again = chat.build_compact_tokenizer(COMPACT_TEXTS, vocab_size=400)
    assert again.get_vocab() == compact_tok.get_vocab()
    compact_tok.save_pretrained(tmp_path)
    for tok in (chat.load_tokenizer(tmp_path), AutoTokenizer.from_pretrained(str(tmp_path))):
        for text in ROUND_TRIP_SAMPLES:
            assert tok.encode(text, add_special_tokens=False) == compact_tok.encode(
                text, add_special_tokens=False)
        assert tok.eos_token == "<|im_end|>"


def test_compact_rejects_bad_input():
    with pytest.raises(ValueError, match="vocab_size=100"):
        chat.build_compact_tokenizer(["abc"], vocab_size=100)
    with pytest.raises(TypeError, match="not one string"):
        chat.build_compact_tokenizer("abc")
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        chat.build_compact_tokenizer(["abc", 3])


def test_compact_max_digits_keeps_numbers_whole_and_round_trips(tmp_path):
    texts = ["The population of Varel is 452. The founding year of Varel is 1302."] * 20 + ["print(452 + 1302)"] * 5
    tok = chat.build_compact_tokenizer(texts, vocab_size=400, max_digits=4)
    pieces = [tok.decode([i]) for i in tok.encode("Varel is 452 and 1302.", add_special_tokens=False)]
    assert "452" in pieces and "1302" in pieces
    # A value is one and the same token after a space, a bracket, a brace or a newline, so copying it
    # from a tool response into code or into \boxed{} is an identity copy.
    ids = {tok.convert_tokens_to_ids(tok.tokenize(t))[-1] for t in (" 1302", "(1302", "{1302", "\n1302")}
    assert ids == {tok.convert_tokens_to_ids("1302")}
    single = chat.build_compact_tokenizer(texts, vocab_size=400)  # Qwen3's split: one digit per token
    assert all(len(p.strip()) <= 1 for p in map(lambda i: single.decode([i]),
                                                  single.encode("452 1302", add_special_tokens=False)) if p.strip().isdigit())
    tok.save_pretrained(tmp_path)
    again = chat.load_tokenizer(tmp_path)
    for text in ROUND_TRIP_SAMPLES + ["123456789 0.5 -42 x1y22"]:
        ids = tok.encode(text, add_special_tokens=False)
        assert again.encode(text, add_special_tokens=False) == ids and tok.decode(ids) == text
    with pytest.raises(ValueError, match="max_digits"):
        chat.build_compact_tokenizer(texts, vocab_size=400, max_digits=0)
