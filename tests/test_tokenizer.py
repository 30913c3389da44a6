"""The tokenizer: hand-checkable cases, encoding layout, bad input, and the oracle.

Handmade vocabularies follow google-research/bert tokenization_test.py; encode
features (pairs, truncation strategies, overflow with stride, padding, offsets,
word ids) are compared with the `tokenizers` library behind BertTokenizerFast.
"""

import json
import pickle
import random

import pytest

from bertkit.text.basic_tokenizer import basic_words, is_control, is_punctuation, is_whitespace
from bertkit.errors import BertkitError
from bertkit.cli.text import format_encoding
from bertkit.text.tokenizer import Tokenizer
from bertkit.text.wordpiece import wordpiece

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# the vocabulary of the original tokenization_test.py (plus the two specials it lacks)
SMALL = SPECIALS + ["want", "##want", "##ed", "wa", "un", "runn", "##ing", ","]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    path = tmp_path_factory.mktemp("small") / "vocab.txt"
    path.write_text("\n".join(SMALL) + "\n")
    return Tokenizer(path)


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_pretrained()


# --- basic tokenizer: the rules of the original, by hand -------------------------


def test_character_classes():
    assert all(is_whitespace(c) for c in " \t\n\r\u00a0\u3000")
    assert not any(is_whitespace(c) for c in "A-\x05")
    assert is_control("\u0005") and is_control("\u200b") and is_control("\u00ad")  # Cc, and Cf counts as C*
    assert not any(is_control(c) for c in "A \t\r\n")
    assert all(is_punctuation(c) for c in "-$`.^~¿«」")
    assert not any(is_punctuation(c) for c in "A 1é")


def _words(text, **kw):
    return [w for w, _ in basic_words(text, **kw)]


def test_basic_lower_and_split():
    assert _words(" \tHeLLo!how  \n Are yoU?  ") == ["hello", "!", "how", "are", "you", "?"]
    assert _words("H\u00e9llo") == ["hello"]


def test_basic_cased_is_exact():
    assert _words(" \tHeLLo!how  \n Are yoU?  ", lowercase=False) == ["HeLLo", "!", "how", "Are", "yoU", "?"]
    assert _words("H\u00e9llo", lowercase=False) == ["H\u00e9llo"]


def test_accent_stripping_apart_from_lowercasing():
    assert _words("H\u00e4LLo", lowercase=True, strip_accents=False) == ["h\u00e4llo"]
    assert _words("H\u00e4LLo", lowercase=False, strip_accents=True) == ["HaLLo"]


def test_cjk_characters_stay_in_their_word_when_not_split(tmp_path):
    """tokenize_chinese_chars=False keeps "中文" one word (google's BasicTokenizer, transformers'
    BertTokenizer): WordPiece then cuts it as 中 ##文. The fast path split CJK at every character anyway,
    making 文 a word of its own ([UNK] here), and its ids differed from ids_batch's."""
    vocab = SPECIALS + ["中", "##文", "a", "##中"]
    split, whole = Tokenizer(vocab), Tokenizer(vocab, tokenize_chinese_chars=False)
    assert split.tokenize("中文 a中") == ["中", "[UNK]", "a", "中"]
    assert whole.tokenize("中文 a中") == ["中", "##文", "a", "##中"]
    assert whole.encode("中文 a中", add_special_tokens=False).offsets == [(0, 1), (1, 2), (3, 4), (4, 5)]
    assert whole.ids_batch(["中文 a中"])[0] == whole.encode("中文 a中", add_special_tokens=False).input_ids
    # a copy (a DataLoader worker's) rebuilds its run pattern for its own setting
    assert pickle.loads(pickle.dumps(whole)).tokenize("中文") == ["中", "##文"]


def test_cleaning_and_cjk():
    assert _words("ah\u535a\u63a8zz") == ["ah", "\u535a", "\u63a8", "zz"]
    assert _words("a\x00b\ufffdc\u0007d e") == ["abcd", "e"]  # dropped characters join the word
    assert _words("\u3053\u3093\u306b\u3061\u306f") == ["\u3053\u3093\u306b\u3061\u306f"]  # kana is not CJK


def test_origins_point_into_the_original_text():
    text = "x \u00c9t\u00e9,\x00ok"
    for word, origin in basic_words(text):
        assert len(origin) == len(word)
    assert basic_words(text) == [("x", [0]), ("ete", [2, 3, 4]), (",", [5]), ("ok", [7, 8])]


# --- wordpiece ----------------------------------------------------------------------


def test_wordpiece_greedy_longest_match():
    vocab = set(SMALL)
    assert wordpiece("unwanted", vocab) == ["un", "##want", "##ed"]
    assert wordpiece("running", vocab) == ["runn", "##ing"]
    assert wordpiece("unwantedx", vocab) == ["[UNK]"]  # no full cover -> one [UNK]
    assert wordpiece("want" * 30, vocab | {"##want"}, max_input_chars_per_word=100) == ["[UNK]"]  # 120 chars
    assert wordpiece("want" * 25, vocab, max_input_chars_per_word=100) == ["want"] + ["##want"] * 24


def test_small_vocab_end_to_end(small):
    assert small.tokenize("UNwant\u00e9d,running") == ["un", "##want", "##ed", ",", "runn", "##ing"]
    assert small.tokenize("unwantedX running") == ["[UNK]", "runn", "##ing"]
    assert small.tokenize("") == []
    assert small.convert_tokens_to_ids(["un", "##want", "nope"]) == [9, 6, 1]


def test_special_tokens_are_never_split(tok):
    assert tok.tokenize("a [MASK] b[SEP]c") == ["a", "[MASK]", "b", "[SEP]", "c"]
    # lower-case text is not a special token: it is split as punctuation + word
    assert tok.tokenize("[mask]") == ["[", "mask", "]"]


def test_max_input_chars_per_word_setting(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(SPECIALS + ["a", "##a"]) + "\n")
    assert Tokenizer(tmp_path / "vocab.txt").tokenize("a" * 100) == ["a"] + ["##a"] * 99
    assert Tokenizer(tmp_path / "vocab.txt").tokenize("a" * 101) == ["[UNK]"]
    assert Tokenizer(tmp_path / "vocab.txt", max_input_chars_per_word=200).tokenize("a" * 150)[:2] == ["a", "##a"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "max_input_chars_per_word": 3}))
    assert Tokenizer.from_pretrained(tmp_path).tokenize("aaaa aaa") == ["[UNK]", "a", "##a", "##a"]


def test_null_settings_in_tokenizer_config(tmp_path):
    """A null do_lower_case is false (as transformers reads it); a null strip_accents is unset: it
    follows the casing."""
    (tmp_path / "vocab.txt").write_text("\n".join(SPECIALS + ["Ab", "ab", "é"]) + "\n")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": None, "strip_accents": None}))
    cased = Tokenizer.from_pretrained(tmp_path)
    assert not cased.lowercase and not cased.strip_accents
    assert cased.tokenize("Ab é") == ["Ab", "é"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "strip_accents": None}))
    assert Tokenizer.from_pretrained(tmp_path).strip_accents  # follows lowercase=True


# --- encoding layout ------------------------------------------------------------------


def test_pair_layout_by_hand(small):
    enc = small.encode("unwanted", "running,")
    assert enc.tokens == ["[CLS]", "un", "##want", "##ed", "[SEP]", "runn", "##ing", ",", "[SEP]"]
    assert enc.token_type_ids == [0, 0, 0, 0, 0, 1, 1, 1, 1]
    assert enc.attention_mask == [1] * 9
    assert enc.offsets == [(0, 0), (0, 2), (2, 6), (6, 8), (0, 0), (0, 4), (4, 7), (7, 8), (0, 0)]
    assert enc.word_ids == [None, 0, 0, 0, None, 0, 0, 1, None]
    assert enc.sequence_ids == [None, 0, 0, 0, None, 1, 1, 1, None]
    assert len(enc) == 9 and enc.to_dict()["input_ids"] == enc.input_ids


def test_padding_and_decode(small):
    enc = small.encode("running", max_length=6, padding="max_length")
    assert enc.tokens == ["[CLS]", "runn", "##ing", "[SEP]", "[PAD]", "[PAD]"]
    assert enc.attention_mask == [1, 1, 1, 1, 0, 0]
    assert enc.offsets[-1] == (0, 0) and enc.word_ids[-1] is None
    assert small.decode(enc.input_ids) == "[CLS] running [SEP] [PAD] [PAD]"
    assert small.decode(enc.input_ids, skip_special_tokens=True) == "running"


def test_batch_tensors_and_arrays(tok):
    import numpy as np
    import torch

    texts, pairs = ["Hello there, world.", "Hi"], ["A pair.", "Another, longer pair of words."]
    pt = tok.encode_batch(texts, pairs)
    singles = [tok.encode(t, p) for t, p in zip(texts, pairs)]
    width = max(len(e) for e in singles)
    assert pt["input_ids"].shape == (2, width) and pt["input_ids"].dtype == torch.long
    for row, e in zip(range(2), singles):
        n = len(e)
        assert pt["input_ids"][row, :n].tolist() == e.input_ids
        assert pt["attention_mask"][row].tolist() == [1] * n + [0] * (width - n)
        assert pt["token_type_ids"][row, :n].tolist() == e.token_type_ids
    npb = tok.encode_batch(texts, pairs, padding="max_length", max_length=16, return_tensors="np")
    assert isinstance(npb["input_ids"], np.ndarray) and npb["input_ids"].shape == (2, 16)
    plain = tok.encode_batch(texts, padding=False, return_tensors=None)
    assert plain["input_ids"] == [tok.encode(t).input_ids for t in texts]
    # padding to max_length with truncation off: a longer row cannot make a [B, T] tensor (it was torch's
    # "expected sequence of length 13 at dim 1 (got 8)"); as lists the rows may differ
    with pytest.raises(BertkitError, match="row 0 has 13 tokens, more than max_length=8.*truncation=True"):
        tok.encode_batch(["a " * 11, "b"], padding="max_length", max_length=8, truncation=False)
    rows = tok.encode_batch(["a " * 11, "b"], padding="max_length", max_length=8, truncation=False,
                            return_tensors=None)["input_ids"]
    assert [len(r) for r in rows] == [13, 8]
    # no text: still [B, T] (0 x 0), as torch.zeros and numpy give it; it was a 1-d [0]
    assert tok.encode_batch([])["attention_mask"].shape == (0, 0)
    assert tok.encode_batch([], padding="max_length", max_length=8, return_tensors="np")["input_ids"].shape == (0, 8)


def test_a_tensor_batch_moves_to_a_device_as_transformers_does(tok):
    """`model(**tok.encode_batch(texts).to(device))`, the transformers habit: once AttributeError: to."""
    batch = tok.encode_batch(["Hello there, world.", "Hi"])
    ids = batch["input_ids"].clone()
    assert batch.to("cpu") is batch and batch["input_ids"].equal(ids)
    batch.to("meta")  # a device with no data: shows the move without a GPU
    assert {v.device.type for v in batch.values()} == {"meta"}
    assert batch.input_ids.shape == ids.shape and batch.encodings[0].tokens[1] == "hello"
    with pytest.raises(BertkitError, match="only a batch of torch tensors moves .*return_tensors='pt'.*input_ids is ndarray"):
        tok.encode_batch(["Hi"], return_tensors="np").to("cpu")


def test_batch_overflow_rows_and_mapping(tok):
    question, contexts = "Who?", [" ".join(str(i) for i in range(40)), "short context", "another " * 25]
    batch = tok.encode_batch([question] * 3, contexts, max_length=16, stride=4, truncation_strategy="only_second",
                             return_overflowing=True, padding="max_length")
    singles = [tok.encode(question, c, max_length=16, stride=4, truncation_strategy="only_second",
                          return_overflowing=True, padding="max_length") for c in contexts]
    rows = [row for e in singles for row in [e, *e.overflowing]]
    assert batch["input_ids"].tolist() == [r.input_ids for r in rows]
    assert batch["overflow_to_sample_mapping"].tolist() == [i for i, e in enumerate(singles) for _ in [e, *e.overflowing]]
    assert batch["input_ids"].shape[1] == 16
    # consecutive windows of the first context share exactly `stride` tokens
    first, second = rows[0], rows[1]
    ctx = [i for i, s in zip(first.input_ids, first.sequence_ids) if s == 1]
    ctx2 = [i for i, s in zip(second.input_ids, second.sequence_ids) if s == 1]
    assert ctx[-4:] == ctx2[:4] and len(ctx) == 16 - 3 - 2 and ctx[4] != ctx2[4]  # "who", "?"


def test_batch_workers_agree(tok):
    texts = [f"Line {i}: the quick brown fox jumps over the lazy dog {i * 7}." for i in range(300)]
    one = tok.encode_batch(texts, num_workers=1, return_tensors=None)
    two = tok.encode_batch(texts, num_workers=2, return_tensors=None)
    assert one["input_ids"] == two["input_ids"]
    assert [e.offsets for e in one.encodings] == [e.offsets for e in two.encodings]
    tok.close()


def test_format_encoding_names_substrings(tok):
    text, pair = "Héllo, world", "ok"
    table = format_encoding(tok, tok.encode(text, pair), text, pair)
    lines = table.splitlines()
    assert lines[0].split() == ["pos", "token", "id", "seg", "word", "offsets", "text"]
    assert "'Héllo'" in lines[2] and "0:5" in lines[2] and "7592" in lines[2]
    assert "'ok'" in table and lines[-1].startswith("7 tokens")


# --- save / load, casing ------------------------------------------------------------------


def test_save_pretrained_round_trip(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["do_lower_case"] is True
    again = Tokenizer.from_pretrained(tmp_path)
    assert again.ids_to_tokens == tok.ids_to_tokens and again.lowercase and again.strip_accents
    assert again.tokenize("Héllo Wörld") == tok.tokenize("Héllo Wörld")
    assert Tokenizer.from_pretrained(tmp_path / "vocab.txt").lowercase  # sibling config is read


def test_a_vocabulary_is_opened_once_so_a_save_landing_meanwhile_cannot_mix_two_files(tmp_path, monkeypatch):
    """Tokenizer.from_pretrained opened vocab.txt twice: for its first two bytes (is it gzip?), then to read it. A
    vocab.txt saved over in between (here by a gzip of another vocabulary: a file every reader takes) was judged by
    one file and read as the other: 'not UTF-8 text'. It is opened once: the tokens of the file it opened."""
    import builtins
    import gzip
    import os

    path, other = tmp_path / "vocab.txt", tmp_path / "other"
    path.write_text("\n".join(SMALL) + "\n")
    other.write_bytes(gzip.compress(("\n".join(SMALL + ["##er"]) + "\n").encode()))
    opens, real = [], builtins.open

    def counting_open(file, *args, **kwargs):
        f = real(file, *args, **kwargs)
        if str(file) == str(path):
            opens.append(file)
            if len(opens) == 1:
                os.replace(other, path)  # a save landing: the open file is still the old one
        return f

    monkeypatch.setattr(builtins, "open", counting_open)
    assert Tokenizer.from_pretrained(path).ids_to_tokens == SMALL  # main: 'is not UTF-8 text'
    assert len(opens) == 1  # main: 2
    assert Tokenizer.from_pretrained(tmp_path).ids_to_tokens == SMALL + ["##er"]  # the gzip saved over it, read


def test_casing_mismatch_is_caught(tok, tmp_path):
    with pytest.raises(BertkitError, match="casing mismatch"):
        Tokenizer.from_pretrained(None, lowercase=False)  # config says do_lower_case=True
    with pytest.raises(BertkitError, match="looks uncased"):
        Tokenizer(tok.ids_to_tokens, lowercase=False)
    cased = SPECIALS + list(dict.fromkeys(w.capitalize() for w in tok.ids_to_tokens if w.isalpha()))[:2000]
    with pytest.raises(BertkitError, match="looks cased"):
        Tokenizer(cased, lowercase=True)
    assert Tokenizer(cased, lowercase=False).tokenize("The") == ["The"]


def test_accent_stripping_follows_lowercase_unless_set():
    vocab = SPECIALS + ["cafe", "café", "CAFÉ"]
    assert Tokenizer(vocab).strip_accents is True
    assert Tokenizer(vocab).tokenize("Café") == ["cafe"]
    assert Tokenizer(vocab, strip_accents=False).tokenize("Café") == ["café"]
    assert Tokenizer(vocab, lowercase=False).tokenize("CAFÉ") == ["CAFÉ"]
    assert Tokenizer(vocab, lowercase=False, strip_accents=True).tokenize("CAFÉ") == ["[UNK]"]


# --- bad input: one clear error each ------------------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda t: t.encode(None), "text must be a str, got NoneType"),
        (lambda t: t.encode(123), "text must be a str, got int"),
        (lambda t: t.encode(["a", "b"]), "use encode_batch"),
        (lambda t: t.encode("a", 5), "pair must be a str"),
        (lambda t: t.tokenize(b"bytes"), "must be a str, got bytes"),
        (lambda t: t.encode_batch("one text"), "use encode for a single text"),
        (lambda t: t.encode_batch(None), "needs a list of str, got NoneType"),
        (lambda t: t.encode_batch(["ok", 3]), r"texts\[1\] must be a str"),
        # transformers' batch of (a, b) pairs: the hint was "use encode_batch", the call being made
        (lambda t: t.encode_batch([("a", "b")]), r"texts\[0\] must be a str, got tuple \(a text pair: give the "
                                                 r"second texts as pairs=\[\.\.\.\], one per text\)$"),
        (lambda t: t.encode_batch(["a", "b"], ["x"]), "one pair per text"),
        (lambda t: t.encode("a", max_length=513), "above 512"),
        (lambda t: t.encode("a", max_length=1), "cannot even hold the 2 special tokens"),
        (lambda t: t.encode("a", "b", max_length=2), "cannot even hold the 3 special tokens"),
        (lambda t: t.encode("a", max_length="64"), "max_length must be an int"),
        (lambda t: t.encode("a", truncation_strategy="longest"), "truncation_strategy must be one of"),
        (lambda t: t.encode("a b c", truncation_strategy="only_second", max_length=3), "needs a pair"),
        (lambda t: t.encode("a", padding="longest"), "padding must be one of"),
        (lambda t: t.encode("a", stride=-1), "stride must be a non-negative int"),
        (lambda t: t.encode("a b c d e f", max_length=5, stride=3, return_overflowing=True), "stride=3 must be smaller"),
        (lambda t: t.encode("a b c d", "e", max_length=4, truncation_strategy="only_second"), "only the second"),
        (lambda t: t.encode_batch(["a", "b c"], padding=False), "return_tensors needs equal-length rows"),
        (lambda t: t.encode_batch(["a"], return_tensors="tf"), "return_tensors must be"),
        (lambda t: t.convert_ids_to_tokens([101, 99999]), "99999 is outside the vocabulary"),
        (lambda t: t.decode(["hello"]), "must hold ints"),
        (lambda t: t.convert_tokens_to_ids("hello"), "list of tokens"),
        # the ids-only batch path: a str would be split into characters, a short max_length would
        # slice from the end ([CLS] a b [SEP] for max_length=1)
        (lambda t: t.ids_batch("hello"), "takes a list of texts, got a str"),
        (lambda t: t.single_ids(["a b c"], max_length=1), "max_length must be None or an int >= 2, got 1"),
        (lambda t: t.ids_lists(["a b c"], max_length=-1), "max_length must be None or an int >= 0, got -1"),
    ],
)
def test_bad_input_gives_clear_error(tok, call, message):
    with pytest.raises(BertkitError, match=message):
        call(tok)


def test_numpy_ids_decode_like_ints(tok):
    """A list of numpy integers (list(array)) is ids, as the array itself is."""
    np = pytest.importorskip("numpy")
    ids = np.array([101, 7592, 102])
    assert tok.decode(list(ids)) == tok.decode(ids) == tok.decode([101, 7592, 102]) == "[CLS] hello [SEP]"


def test_a_token_list_without_the_special_tokens_is_refused():
    with pytest.raises(BertkitError, match=r"lacks the special token\(s\) \[PAD\], \[UNK\]"):
        Tokenizer(["[CLS]", "[SEP]", "[MASK]", "a"])
    with pytest.raises(BertkitError, match="vocab_file must be a vocab.txt.*got NoneType"):
        Tokenizer(None)
    assert Tokenizer(tuple(SMALL)).tokenize("unwanted") == ["un", "##want", "##ed"]
    # the rules of a vocab.txt hold for a list too: a repeated token left id 8 unreachable and every later
    # id one off from its position, silently
    with pytest.raises(BertkitError, match="token 'want' appears twice"):
        Tokenizer(SMALL + ["want"])
    with pytest.raises(BertkitError, match="empty or has surrounding whitespace"):
        Tokenizer(SMALL + [" b"])


@pytest.mark.parametrize("settings, message", [
    ({"do_lower_case": "false"}, 'do_lower_case must be true or false, got "false"'),
    ({"strip_accents": 0}, "strip_accents must be true, false or null, got 0"),
    ({"max_input_chars_per_word": "abc"}, 'max_input_chars_per_word must be a positive whole number, got "abc"'),
])
def test_tokenizer_config_values_of_the_wrong_type_are_named(tmp_path, settings, message):
    """bool("false") is True: a quoted flag once turned lower-casing on without a word."""
    (tmp_path / "vocab.txt").write_text("\n".join(SMALL) + "\n")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    with pytest.raises(BertkitError, match="tokenizer_config.json: " + message):
        Tokenizer.from_pretrained(tmp_path)


@pytest.mark.oracle
def test_a_tokenizer_json_alone_gives_its_own_settings(tmp_path, transformers_mod):
    """A folder with only tokenizer.json (the Rust tokenizer's save, no tokenizer_config.json) is read
    with the normalizer and WordPiece settings it states, as transformers reads it; they were left at
    our defaults, so a cased folder was lower-cased and every capitalised word became [UNK]."""
    from tokenizers import BertWordPieceTokenizer

    vocab = SPECIALS + ["Hello", "World", "é", "caf", "##é", "cafe", "中", "##文", "a", "##a", "!"]
    rust = BertWordPieceTokenizer({t: i for i, t in enumerate(vocab)}, lowercase=False, strip_accents=False,
                                  handle_chinese_chars=False)
    data = json.loads(rust.to_str())
    data["model"]["max_input_chars_per_word"] = 4
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    ours = Tokenizer.from_pretrained(tmp_path)
    assert (ours.lowercase, ours.strip_accents, ours.tokenize_chinese_chars, ours.max_input_chars_per_word) == (
        False, False, False, 4)
    oracle = transformers_mod.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    for text in ["Hello World!", "hello café", "中文 aaaa aaaaa", "Héllo"]:
        assert ours.encode(text).input_ids == oracle(text)["input_ids"], text
    # a tokenizer_config.json beside it still decides (transformers rebuilds the normalizer from it)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    assert Tokenizer.from_pretrained(tmp_path).lowercase


@pytest.mark.parametrize("key, value", [("unk_token", "[unused0]"), ("cls_token", {"content": "<s>"}),
                                        ("mask_token", "<mask>")])
def test_special_tokens_renamed_in_tokenizer_config_are_refused(tmp_path, key, value):
    """transformers saves `unk_token="[unused0]"` in tokenizer_config.json and then maps unknown words
    there; we use [UNK] whatever the file says, so the ids would silently differ: refused, named."""
    (tmp_path / "vocab.txt").write_text("\n".join(SMALL + ["[unused0]", "<s>", "<mask>"]) + "\n")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, key: value}))
    with pytest.raises(BertkitError, match=f"tokenizer_config.json: {key} is .* bertkit uses"):
        Tokenizer.from_pretrained(tmp_path)
    same = {"unk_token": "[UNK]", "cls_token": {"content": "[CLS]", "special": True}, "mask_token": "[MASK]"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, key: same[key]}))
    assert Tokenizer.from_pretrained(tmp_path).tokenize("unwanted") == ["un", "##want", "##ed"]


def test_missing_tokenizer_path(tmp_path):
    with pytest.raises(BertkitError, match="no tokenizer at"):
        Tokenizer.from_pretrained(tmp_path / "nope")
    with pytest.raises(BertkitError, match="has no vocab.txt"):
        Tokenizer.from_pretrained(tmp_path)
    with pytest.raises(BertkitError, match="no tokenizer at 5"):  # was a TypeError from pathlib
        Tokenizer.from_pretrained(5)


# --- the oracle: encode features -------------------------------------------------------

ORACLE_TEXTS = [
    "Hello, how are you? I'm fine.",
    "The quick brown fox jumps over the lazy dog near the river bank at sunset.",
    "Héllo Wörld naïve café résumé Ærøskøbing İstanbul ǅemal ΟΔΟΣ Straße",
    "a\x00b\ufffdc \u200bzero\u200dwidth soft\u00adhyphen \u2028line\u2029para \u00a0nbsp",
    "CJK 中文字符测试 かなカナ 한국어 \uf900\U0002f800 mixed中a文",
    "punct: ¿¡«»—–…“”‘’ $5+3=8 ^_^ `code` ~tilde~ \u037e\u0387\u1fef",
    "emoji 😀👍🏽 👨‍👩‍👧 math ∑∫√ arrows ←→",
    "[CLS] [MASK] inside a[SEP]b and [mask] lowercase [UNK]",
    "supercalifragilisticexpialidocious " + "x" * 101 + " pneumonoultramicroscopicsilicovolcanoconiosis",
    "combining e\u0301 a\u0308 n\u0303 \u0301alone",
    "",
    "   ",
]


def _flat(rust_enc):
    return [rust_enc, *rust_enc.overflowing]


def _same(ours, theirs):
    assert ours.input_ids == theirs.ids
    assert ours.token_type_ids == theirs.type_ids
    assert ours.attention_mask == theirs.attention_mask
    assert ours.offsets == theirs.offsets
    assert ours.word_ids == theirs.word_ids
    assert ours.sequence_ids == theirs.sequence_ids
    assert ours.tokens == theirs.tokens


@pytest.mark.oracle
@pytest.mark.parametrize("text", ORACLE_TEXTS)
def test_tricky_text_matches_oracle(tok, rust_oracle, text):
    _same(tok.encode(text), rust_oracle.encode(text))


@pytest.mark.oracle
@pytest.mark.parametrize("strategy", ["longest_first", "only_first", "only_second"])
@pytest.mark.parametrize("max_length", [9, 12, 17, 30])
@pytest.mark.parametrize("lengths", [(3, 20), (20, 3), (14, 15), (6, 6)])
def test_pair_truncation_matches_oracle(tok, rust_oracle, strategy, max_length, lengths):
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()
    a = " ".join((words * 3)[: lengths[0]])
    b = " ".join((words[::-1] * 3)[: lengths[1]])
    rust_oracle.enable_truncation(max_length, strategy=strategy)
    try:
        theirs = rust_oracle.encode(a, b)
    except Exception:  # the oracle refuses when the other segment alone is too long
        with pytest.raises(BertkitError):
            tok.encode(a, b, max_length=max_length, truncation_strategy=strategy)
        return
    finally:
        rust_oracle.no_truncation()
    ours = tok.encode(a, b, max_length=max_length, truncation_strategy=strategy)
    _same(ours, theirs)
    assert len(ours) <= max_length


@pytest.mark.oracle
@pytest.mark.parametrize("stride", [0, 2, 5])
@pytest.mark.parametrize("max_length", [8, 13])
def test_overflow_windows_match_oracle(tok, rust_oracle, stride, max_length):
    text = ORACLE_TEXTS[1] + " " + ORACLE_TEXTS[2]
    question = "Where does the fox jump?"
    # a single long text
    rust_oracle.enable_truncation(max_length, stride=stride, strategy="longest_first")
    ours = tok.encode(text, max_length=max_length, stride=stride, return_overflowing=True)
    theirs = _flat(rust_oracle.encode(text))
    assert len(ours.overflowing) + 1 == len(theirs) > 2
    for o, t in zip([ours, *ours.overflowing], theirs):
        _same(o, t)
    # QA layout: question first, the context cut into windows (only_second)
    rust_oracle.enable_truncation(max_length + 10, stride=stride, strategy="only_second")
    ours = tok.encode(question, text, max_length=max_length + 10, stride=stride, truncation_strategy="only_second",
                      return_overflowing=True)
    theirs = _flat(rust_oracle.encode(question, text))
    rust_oracle.no_truncation()
    assert len(ours.overflowing) + 1 == len(theirs) > 2
    for o, t in zip([ours, *ours.overflowing], theirs):
        _same(o, t)


@pytest.mark.oracle
def test_overflow_with_both_segments_cut(tok, rust_oracle):
    a, b = ORACLE_TEXTS[1], ORACLE_TEXTS[2]
    rust_oracle.enable_truncation(14, stride=1, strategy="longest_first")
    theirs = _flat(rust_oracle.encode(a, b))
    rust_oracle.no_truncation()
    ours = tok.encode(a, b, max_length=14, stride=1, return_overflowing=True)
    assert len(ours.overflowing) + 1 == len(theirs)
    for o, t in zip([ours, *ours.overflowing], theirs):
        assert o.input_ids == t.ids and o.offsets == t.offsets


@pytest.mark.oracle
def test_batch_padding_matches_oracle(tok, rust_oracle):
    texts = ORACLE_TEXTS[:4]
    rust_oracle.enable_padding(pad_id=tok.pad_token_id, pad_token="[PAD]")
    theirs = rust_oracle.encode_batch(texts)
    rust_oracle.no_padding()
    ours = tok.encode_batch(texts, return_tensors=None)
    for o, t in zip(ours.encodings, theirs):
        _same(o, t)
    assert ours["input_ids"] == [t.ids for t in theirs]


@pytest.mark.parametrize("padding,max_length,multiple,truncation", [
    ("longest", 512, 8, True), ("longest", 512, 1, True), ("longest", 512, 3, False), ("longest", 12, 4, True),
    ("max_length", 16, 8, True), ("max_length", 10, 8, False), ("max_length", 7, 5, False),
    ("longest", 512, 3, True), ("max_length", 10, 8, True)])  # the last two: max_length not a multiple
def test_pad_to_multiple_of_matches_bert_tokenizer_fast(tok, default_model_dir, transformers_mod, padding,
                                                        max_length, multiple, truncation):
    fast = transformers_mod.BertTokenizerFast.from_pretrained(str(default_model_dir))
    batches = [(["Hello, world!", "a much longer sentence than the first one here"], None),
               (["short", "naïve café au lait"], ["second segment", "B"]), (["exactly"], None)]
    options = dict(padding=padding, truncation=truncation, max_length=max_length, pad_to_multiple_of=multiple)
    if truncation and max_length % multiple:  # rows cut at max_length could not be padded to a multiple of it
        with pytest.raises(ValueError, match="not a multiple of pad_to_multiple_of"):
            fast(batches[0][0], **options)
        with pytest.raises(BertkitError, match=f"max_length={max_length} is not a multiple of pad_to_multiple_of"):
            tok.encode_batch(batches[0][0], **options)
        return
    for texts, pairs in batches:
        theirs = fast(texts, pairs, **options)
        ours = tok.encode_batch(texts, pairs, return_tensors=None, **options)
        for key in ("input_ids", "token_type_ids", "attention_mask"):
            assert ours[key] == theirs[key], (texts, key)
        assert len(ours["input_ids"][0]) % multiple == 0
        if padding == "max_length":  # one text alone: the same rows
            one = fast(texts[0], None if pairs is None else pairs[0], **options)
            enc = tok.encode(texts[0], None if pairs is None else pairs[0], **options)
            assert enc.input_ids == one["input_ids"] and enc.attention_mask == one["attention_mask"]


@pytest.mark.parametrize("value,message", [(0, "pad_to_multiple_of must be a positive int, got 0"),
                                           (-8, "got -8"), (2.0, "got 2.0"), (True, "got True")])
def test_pad_to_multiple_of_refuses_a_non_positive_value_in_one_line(tok, value, message):
    with pytest.raises(BertkitError, match=message) as err:
        tok.encode_batch(["a", "b c"], pad_to_multiple_of=value)
    assert "\n" not in str(err.value)
    with pytest.raises(BertkitError, match="pad_to_multiple_of needs padding"):  # nothing to round up
        tok.encode_batch(["a", "b c"], padding=False, pad_to_multiple_of=8, return_tensors=None)


def test_cli_tokenize_json(tok, capsys):
    from bertkit.cli import main

    assert main(["tokenize", "Hello, world!", "--pair", "Fine.", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    enc = tok.encode("Hello, world!", "Fine.")
    assert out["input_ids"] == enc.input_ids and out["offsets"] == [list(o) for o in enc.offsets]
    assert main(["tokenize", "Hello"]) == 0
    assert "hello" in capsys.readouterr().out
    assert main(["tokenize", "x", "--vocab", "/nonexistent/dir"]) == 2
    assert "no tokenizer at" in capsys.readouterr().err


def test_cli_tokenize_reads_each_text_once(tok, monkeypatch, capsys):
    """`bertkit tokenize` encoded each text twice, cut to --max-length and whole (to say the cut): a text that
    fits is its whole encoding now, read once; a long one is read whole once, and its cut again reads only the
    head it keeps (and the short pair beside it). What is printed is the tokenizer's own encoding."""
    from bertkit.cli import main

    read, segment = [], Tokenizer._segment
    monkeypatch.setattr(Tokenizer, "_segment", lambda self, text, *a: read.append(text) or segment(self, text, *a))
    long = "The animal didn't cross the street because it was too tired. " * 200
    for text, pair, length, fits in (("Hello, world!", "Fine.", 512, True), ("naïve café", None, 6, True),
                                     (long, None, 512, False), (long, "and a pair", 40, False)):
        want = tok.encode(text, pair, max_length=length).to_dict()
        read.clear()
        assert main(["tokenize", text, *(["--pair", pair] if pair else []), "--max-length", str(length), "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == want
        if fits:
            assert read == [text, *([pair] if pair else [])]
        else:  # the long text whole once, then a head of it a fraction as long
            assert read.count(text) == 1 and sum(len(r) for r in read if r != pair) < 1.5 * len(text), read


@pytest.mark.oracle
def test_cli_tokenize_says_when_it_cut_the_text(rust_oracle, capsys):
    """A text past --max-length (512 by default) was shown cut with "512 tokens, 512 attended", nothing saying
    that more of it existed: the summary (and, with --json, standard error) names the whole length now,
    counted by the Rust tokenizer."""
    from bertkit.cli import main

    text = "The animal didn't cross the street because it was too tired. " * 50
    whole = len(rust_oracle.encode(text).ids)
    assert main(["tokenize", text]) == 0
    assert f"512 tokens, 512 attended (cut from {whole} tokens to 512 by --max-length 512)" in capsys.readouterr().out
    assert main(["tokenize", text, "--json", "--max-length", "20"]) == 0
    out, err = capsys.readouterr()
    assert len(json.loads(out)["input_ids"]) == 20 and f"cut from {whole} tokens to 20" in err
    assert main(["tokenize", "a short one"]) == 0
    assert "cut" not in capsys.readouterr().out
    # above 512: the tokenizer's "use max_length <= 512 (and stride/return_overflowing ...)", arguments the
    # command does not have
    with pytest.raises(SystemExit) as stop:  # refused where it is typed, as argparse refuses
        main(["tokenize", "a short one", "--max-length", "1000"])
    assert stop.value.code == 2
    assert "argument --max-length: must be at most 512" in capsys.readouterr().err


@pytest.mark.parametrize("how", [["-"], []])
def test_cli_tokenize_reads_standard_input_one_encoding_per_line(tok, how):
    import subprocess
    import sys

    lines = ["Hello, world!", "naïve café", "", "BERT reads both ways."]
    res = subprocess.run([sys.executable, "-m", "bertkit.cli", "tokenize", *how, "--json", "--max-length", "6"],
                         input=("\n".join(lines) + "\n").encode("utf-8"), capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr.decode()
    got = [json.loads(line) for line in res.stdout.decode("utf-8").splitlines()]
    assert got == [tok.encode(line, max_length=6).to_dict() for line in lines]
    res = subprocess.run([sys.executable, "-m", "bertkit.cli", "tokenize", *how, "--json", "--pair", "B c"],
                         input="A\nnaïve\n".encode("utf-8"), capture_output=True, timeout=120)
    got = [json.loads(line) for line in res.stdout.decode("utf-8").splitlines()]
    assert got == [tok.encode(line, "B c").to_dict() for line in ("A", "naïve")]  # --pair: each line's
    # the readable table: one per line, a blank line between two
    res = subprocess.run([sys.executable, "-m", "bertkit.cli", "tokenize", *how], input=b"first one\nsecond\n",
                         capture_output=True, timeout=120)
    assert res.returncode == 0 and res.stdout.decode() == "\n\n".join(
        format_encoding(tok, tok.encode(t), t) for t in ("first one", "second")) + "\n"


def test_cli_tokenize_refuses_bad_standard_input_in_one_line():
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "bertkit.cli", "tokenize", "-"], input=b"ok\ncaf\xe9\n",
                         capture_output=True, timeout=120)
    assert res.returncode == 2 and res.stderr.decode().count("\n") == 1
    assert "standard input line 2 is not UTF-8" in res.stderr.decode()


def test_the_tokenizer_commands_start_without_torch():
    # the parser is built from every command's config dataclasses; none of them may pull in torch,
    # so `bertkit --help` and `bertkit tokenize` start in a blink
    import subprocess
    import sys

    code = ("import sys, contextlib, io\nfrom bertkit.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    main(['tokenize', 'Hello'])\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_long_text_is_tokenized_only_as_far_as_its_cut_needs(default_model_dir):
    """Tokenizer.head: a prefix cut at a space has the whole text's first pieces (a space is a safe boundary),
    so a cut text needs only as much of itself as holds the cut; the ids equal the whole text's, cut."""
    tok = Tokenizer.from_pretrained(default_model_dir)
    rng = random.Random(0)
    words = ["protein", "Folding", "naïve", "İstanbul", "漢字", "...", "!!", "[MASK]", "[CLS]x", "co-operate",
             "x" * 150, "\u0301", "a\u00a0b", "\t", "\n", "ﬁne", "😀", "ΣΑΣ", "don't", "\x00", "U.S.A."]
    for _ in range(300):
        # any whitespace of BERT's may separate words; \x1f and \x85 are not (dropped, they join two words)
        text = "".join(rng.choice(words) + rng.choice([" ", " ", "\n", "\t", "\r\n", "\x1f", "\x85"])
                       for _ in range(rng.randint(1, 600)))
        n = rng.randint(0, 300)
        whole, head = tok.ids_batch([text])[0], tok.head(text, n)
        pieces = tok.ids_batch([head])[0]
        assert whole[: len(pieces)] == pieces and (head == text or len(pieces) > n)
        assert tok.ids_lists([text], n)[0] == whole[:n]
        assert tok.single_ids([text], n + 2)[0] == tok.encode(text, max_length=n + 2).input_ids
    huge = "the cell folds the protein. " * 40000
    assert len(tok.head(huge, 254)) < 20000 and tok.single_ids([huge], 256)[0][1:-1] == tok.ids_batch([huge])[0][:254]
    # one word a line (a CoNLL file read whole) has no space: it was read to its end, 500 times slower
    lines = "\n".join(huge.split())
    assert len(tok.head(lines, 254)) < 20000 and tok.encode(lines, max_length=256).input_ids[1:-1] == tok.ids_batch([lines])[0][:254]


def _handed(tok) -> list:
    """Record the length of every text `tok` tokenizes (its `_segment` and `ids_batch`): what reading costs."""
    seen, segment, ids_batch = [], tok._segment, tok.ids_batch
    tok._segment = lambda text: seen.append(len(text)) or segment(text)
    tok.ids_batch = lambda texts: seen.extend(map(len, texts)) or ids_batch(texts)
    return seen


@pytest.mark.oracle
def test_a_cut_pair_is_read_only_as_far_as_its_cut_and_keeps_the_whole_texts_ids(default_model_dir, rust_oracle):
    """encode(text, pair) with longest_first reads each side only as far as `Tokenizer.head` (plus, when both are
    cut to halves of an odd budget, as far as tells which one is longer: that one keeps the odd token). The ids
    equal the whole texts' cut (encode with a `head` that returns the whole text) and the Rust tokenizer of
    transformers' BertTokenizerFast (the oracle) on odd text, either side the longer, odd and even budgets."""
    tok = Tokenizer.from_pretrained(default_model_dir)  # its own: the test swaps its methods

    def oracle(a, b, n):
        rust_oracle.enable_truncation(n, strategy="longest_first")
        try:
            return rust_oracle.encode(a, b).ids
        finally:
            rust_oracle.no_truncation()

    rng = random.Random(1)
    words = ["protein", "Folding", "naïve", "İstanbul", "漢字", "...", "!!", "[MASK]", "co-operate", "x" * 150,
             "\u0301", "a\u00a0b", "\t", "\n", "ﬁne", "😀", "ΣΑΣ", "don't", "\x00", "U.S.A.", "漢字漢字漢字", "é"]
    both_cut_odd = 0
    for _ in range(200):
        n = rng.choice([8, 9, 16, 17, 32, 33])
        sizes = rng.choice([(1, 120), (120, 1), (60, 60), (n, n), (n // 2, 150), (150, n // 2),
                            (rng.randint(1, 150), rng.randint(1, 150))])
        a, b = (" ".join(rng.choice(words) for _ in range(k)) for k in sizes)
        got = tok.encode(a, b, max_length=n)
        tok.head = lambda text, _: text  # every text read whole, as encode read them before
        whole = tok.encode(a, b, max_length=n)
        del tok.head
        assert (got.input_ids, got.token_type_ids, got.offsets) == (whole.input_ids, whole.token_type_ids, whole.offsets)
        assert got.input_ids == oracle(a, b, n), (n, sizes)
        heads = [tok.head(t, n - 3) for t in (a, b)]
        both_cut_odd += n % 2 == 0 and all(len(h) < len(t) for h, t in zip(heads, (a, b)))
    assert both_cut_odd > 20, both_cut_odd  # the case where the longer side must be found was met
    # a short question beside a 120 KB passage, and the reverse: the passage is read as far as its cut needs
    long_text = "the protein folds in the cell, which decides what it does. " * 2000
    for first, second in [("what does a protein do ?", long_text), (long_text, "what does a protein do ?")]:
        handed = _handed(tok)
        ids = tok.encode(first, second, max_length=64).input_ids
        del tok._segment, tok.ids_batch
        assert ids == oracle(first, second, 64)
        assert sum(handed) < 5000, sum(handed)  # of 120,000 characters


def test_a_casing_switch_given_as_a_str_is_refused():
    """Tokenizer(vocab, lowercase="false") lowercased (a non-empty str is true; errors.switch, as embed's and the
    configs'). Property: numpy's False and 0 read as False does: "Hello" keeps its capital."""
    import numpy as np

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "Hello", "hello"]
    for name in ("lowercase", "strip_accents", "tokenize_chinese_chars"):
        with pytest.raises(BertkitError, match=f"^{name} must be True or False, got 'false'$"):
            Tokenizer(vocab, **{name: "false"})
    for false in (np.bool_(False), 0):
        tok = Tokenizer(vocab, lowercase=false)
        assert tok.lowercase is False and tok.tokenize("Hello") == Tokenizer(vocab, lowercase=False).tokenize("Hello")
    assert Tokenizer(vocab, lowercase=False).tokenize("Hello") == ["Hello"]
