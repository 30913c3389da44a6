"""vocab.txt: loading, saving and the checks that name what is wrong."""

import json

import pytest

from bertkit.errors import BertkitError
from bertkit.text.tokenizer import Tokenizer
from bertkit.text.vocab import SPECIAL_TOKENS, load_vocab, save_vocab

GOOD = list(SPECIAL_TOKENS) + ["the", "##s", "cat"]


def _write(tmp_path, lines, name="vocab.txt"):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_ids_are_line_numbers(tmp_path):
    path = _write(tmp_path, GOOD)
    assert load_vocab(path) == GOOD
    assert load_vocab(tmp_path) == GOOD  # a directory holding vocab.txt
    tok = Tokenizer(path)
    assert tok.vocab["cat"] == 7 and tok.ids_to_tokens[5] == "the" and len(tok) == 8
    assert (tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id) == (0, 1, 2, 3, 4)
    assert tok.all_special_ids == [0, 1, 2, 3, 4]


def test_default_vocab_is_bert_base_uncased(default_model_dir):
    tokens = load_vocab(default_model_dir / "vocab.txt")
    assert len(tokens) == 30522
    # the published positions of bert-base-uncased's special tokens
    assert [tokens.index(t) for t in SPECIAL_TOKENS] == [0, 100, 101, 102, 103]


def test_save_round_trip_and_no_trailing_line(tmp_path):
    tokens = GOOD + ["a\u2028b", "ünï"]  # a line separator inside a token must not split it
    path = save_vocab(tokens, tmp_path / "out" / "vocab.txt")
    assert path.read_bytes().count(b"\n") == len(tokens)
    assert load_vocab(path) == tokens


def test_crlf_lines_are_accepted(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_bytes("\r\n".join(GOOD).encode() + b"\r\n")
    assert load_vocab(path) == GOOD


@pytest.mark.parametrize(
    "lines, message",
    [
        ([t for t in GOOD if t != "[MASK]"], r"missing special token\(s\) \[MASK\]"),
        ([t for t in GOOD if t not in ("[PAD]", "[SEP]")], r"missing special token\(s\) \[PAD\], \[SEP\]"),
        (GOOD + ["the"], r"token 'the' appears twice \(lines 6 and 9\)"),
        (GOOD[:6] + [""] + GOOD[6:], "line 7 is empty"),
        (GOOD + [" cat "], "surrounding whitespace"),
    ],
)
def test_broken_vocab_files(tmp_path, lines, message):
    path = _write(tmp_path, lines)
    with pytest.raises(BertkitError, match=message):
        load_vocab(path)
    with pytest.raises(BertkitError, match=message):
        Tokenizer(path)


def test_not_a_vocab_file(tmp_path):
    with pytest.raises(BertkitError, match="vocabulary file not found"):
        load_vocab(tmp_path / "missing.txt")
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(BertkitError, match="is not UTF-8 text"):
        load_vocab(binary)
    with pytest.raises(BertkitError, match="missing special token"):
        save_vocab(["a", "b"], tmp_path / "v.txt")


def test_from_pretrained_bad_config(tmp_path):
    _write(tmp_path, GOOD)
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(BertkitError, match="tokenizer_config.json is not valid JSON"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(BertkitError, match="unknown tokenizer setting 'lower'"):
        Tokenizer.from_pretrained(tmp_path, lower=True)


def test_cli_vocab_check(tmp_path, capsys):
    from bertkit.cli import main

    assert main(["vocab", "check"]) == 0
    out = capsys.readouterr().out
    assert "ok: 30522 tokens" in out and "[MASK]=103" in out
    _write(tmp_path, GOOD + ["cat"])
    assert main(["vocab", "check", str(tmp_path)]) == 2
    assert "token 'cat' appears twice" in capsys.readouterr().err


def test_cli_vocab_check_says_a_vocabulary_of_special_tokens_only_has_no_word(tmp_path, capsys):
    # it said "ok: 5 tokens"; pre-training refuses such a vocabulary (every word [UNK], nothing to predict)
    from bertkit.cli import main
    from bertkit.pretraining.masking import MaskVocab

    _write(tmp_path, GOOD[:5])
    assert sorted(GOOD[:5]) == sorted(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    with pytest.raises(BertkitError) as refused:  # the reference: what pre-training says of it
        MaskVocab.from_tokens(GOOD[:5])
    assert main(["vocab", "check", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "bertkit: error: " + str(refused.value).replace("the vocabulary", str(tmp_path), 1)
    _write(tmp_path, GOOD[:5] + ["a"])
    assert main(["vocab", "check", str(tmp_path)]) == 0 and "ok: 6 tokens" in capsys.readouterr().out


@pytest.mark.oracle
def test_a_folder_with_only_tokenizer_json_loads_its_wordpiece_vocabulary(tmp_path, default_model_dir,
                                                                          transformers_mod):
    """sentence-transformers 6 saves tokenizer.json and no vocab.txt: the vocabulary is read from it."""
    hf = transformers_mod.BertTokenizerFast.from_pretrained(str(default_model_dir))
    hf.save_pretrained(str(tmp_path))
    (tmp_path / "vocab.txt").unlink(missing_ok=True)  # transformers 5 writes none
    assert (tmp_path / "tokenizer.json").is_file()
    ours = Tokenizer.from_pretrained(tmp_path)
    reference = Tokenizer.from_pretrained(default_model_dir)
    assert ours.ids_to_tokens == reference.ids_to_tokens and ours.lowercase == reference.lowercase
    text = "Sentence embeddings, unaffable Ödön and 東京 in one line."
    assert ours.encode(text).input_ids == hf(text)["input_ids"]
    # the file itself, as `bertkit tokenize --vocab .../tokenizer.json` passes it: was read as a vocab.txt
    # whose lines are JSON, "missing special token(s) [PAD], ..."
    assert Tokenizer.from_pretrained(tmp_path / "tokenizer.json").encode(text).input_ids == hf(text)["input_ids"]
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {"a": 0}}}')
    with pytest.raises(BertkitError, match="BPE tokenizer, not WordPiece"):
        Tokenizer.from_pretrained(tmp_path)


@pytest.mark.oracle
def test_tokens_added_beyond_the_wordpiece_vocabulary_are_refused_not_dropped(tmp_path, default_model_dir,
                                                                              transformers_mod):
    """`add_tokens(["[E1]"])` then `save_pretrained` keeps [E1] in tokenizer.json's added_tokens, outside
    model.vocab; reading the vocabulary alone dropped it, and "[E1]" became five other ids. Refused,
    naming the tokens; the special tokens BERT already has stay fine (model2vec lists them there)."""
    hf = transformers_mod.BertTokenizerFast.from_pretrained(str(default_model_dir))
    hf.add_tokens(["[E1]", "[/E1]"], special_tokens=True)
    hf.add_tokens(["newword"])
    hf.save_pretrained(str(tmp_path))
    (tmp_path / "vocab.txt").unlink(missing_ok=True)
    with pytest.raises(BertkitError, match=r"adds 3 token\(s\) beyond its WordPiece vocabulary \(\[E1\], \[/E1\], newword\)"):
        Tokenizer.from_pretrained(tmp_path)
    plain = tmp_path / "plain"
    transformers_mod.BertTokenizerFast.from_pretrained(str(default_model_dir)).save_pretrained(str(plain))
    assert json.loads((plain / "tokenizer.json").read_text())["added_tokens"]  # the five specials are listed
    assert len(Tokenizer.from_pretrained(plain)) == 30522


def test_a_vocabulary_larger_than_the_weights_is_refused_naming_the_file_read(tmp_path, default_model_dir):
    """vocab_size (config.json's embedding rows): a vocabulary with more tokens would index past the table.
    The message named vocab.txt even for a folder that has none (its tokenizer.json was read)."""
    with pytest.raises(BertkitError, match=r"vocab.txt has 30522 tokens but config.json's vocab_size is 100"):
        Tokenizer.from_pretrained(default_model_dir, vocab_size=100)
    (tmp_path / "tokenizer.json").write_text((default_model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    with pytest.raises(BertkitError, match=r"tokenizer.json has 30522 tokens but config.json's vocab_size is 100"):
        Tokenizer.from_pretrained(tmp_path, vocab_size=100)
    assert len(Tokenizer.from_pretrained(tmp_path, vocab_size=30522)) == 30522


def test_tokens_added_in_a_slow_tokenizers_folder_are_refused_too(tmp_path):
    """transformers 4 saved a BertTokenizer's added tokens beside vocab.txt: in tokenizer_config.json's
    added_tokens_decoder (id -> token) and in added_tokens.json (token -> id). vocab.txt alone dropped them."""
    _write(tmp_path, GOOD)
    decoder = {str(i): {"content": t, "special": True} for i, t in enumerate(GOOD[:5])}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "added_tokens_decoder": decoder}))
    assert len(Tokenizer.from_pretrained(tmp_path)) == 8  # the special tokens at their own ids
    decoder["8"] = {"content": "[E1]", "special": True}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "added_tokens_decoder": decoder}))
    with pytest.raises(BertkitError, match=r"tokenizer_config.json adds 1 token\(s\) beyond its WordPiece vocabulary \(\[E1\]\)"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    (tmp_path / "added_tokens.json").write_text(json.dumps({"[E2]": 8}))
    with pytest.raises(BertkitError, match=r"added_tokens.json adds 1 token\(s\) .*\(\[E2\]\)"):
        Tokenizer.from_pretrained(tmp_path)
