"""A BERT WordPiece tokenizer as a Hugging Face `tokenizer.json`, both ways.

The Rust `tokenizers` library (and through it sentence-transformers' `StaticEmbedding`
and model2vec) reads a tokenizer from one JSON file describing its pipeline, the
stages our Tokenizer runs (`bertkit.text.tokenizer`):

    normalizer      BertNormalizer {clean_text, handle_chinese_chars, strip_accents, lowercase}
    pre_tokenizer   BertPreTokenizer (whitespace and punctuation)
    model           WordPiece {vocab: token -> id, unk_token, continuing_subword_prefix "##",
                               max_input_chars_per_word}
    post_processor  TemplateProcessing: [CLS] $A [SEP] ($B:1 [SEP]:1)
    decoder         WordPiece {prefix "##", cleanup}
    added_tokens    the special tokens, matched whole before normalisation

`write_tokenizer_json` writes that file from our vocabulary and settings (the layout
`BertTokenizerFast.save_pretrained` gives); `read_tokenizer_json` builds our Tokenizer
from one, its settings taken from the normalizer and model (a folder with only this
file, as sentence-transformers and model2vec save static models, has no
tokenizer_config.json). Only BERT's pipeline is read; another (a BPE, a
Metaspace pre-tokenizer) is an error naming what was found.

The file's `truncation` (null, or {max_length, ...}) is where the Rust tokenizer cuts every
text; sentence-transformers' StaticEmbedding tokenizes through it, so for a static model it is
the model's length limit: `write_tokenizer_json(max_length=...)` sets it, `truncation_length`
reads it.

Deviation: strip_accents null means "follow lowercase", in both libraries; we write it out.
"""

from __future__ import annotations

import json
from pathlib import Path

from bertkit.data.atomic import write_lines
from bertkit.errors import BertkitError
from bertkit.text.tokenizer import Tokenizer
from bertkit.text.tokenizer_config import pipeline_settings
from bertkit.text.vocab import CLS, SEP, SPECIAL_TOKENS, UNK, tokens_from_tokenizer_json

TOKENIZER_JSON = "tokenizer.json"
CONTINUATION = "##"  # WordPiece's prefix of a word-internal piece (bertkit.text.wordpiece)


def _added(tok: Tokenizer) -> list[dict]:
    return [{"id": tok.vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True} for t in sorted(SPECIAL_TOKENS, key=tok.vocab.get)]


def _post_processor(tok: Tokenizer) -> dict:
    def special(name, type_id):
        return {"SpecialToken": {"id": name, "type_id": type_id}}

    def sequence(name, type_id):
        return {"Sequence": {"id": name, "type_id": type_id}}

    return {"type": "TemplateProcessing",
            "single": [special(CLS, 0), sequence("A", 0), special(SEP, 0)],
            "pair": [special(CLS, 0), sequence("A", 0), special(SEP, 0), sequence("B", 1), special(SEP, 1)],
            "special_tokens": {t: {"id": t, "ids": [tok.vocab[t]], "tokens": [t]} for t in (CLS, SEP)}}


def tokenizer_json(tok: Tokenizer, max_length: int | None = None) -> dict:
    """The tokenizer.json object of `tok` (see the module docstring); texts cut at `max_length` tokens if given."""
    cut = None if max_length is None else {"direction": "Right", "max_length": int(max_length),
                                           "strategy": "LongestFirst", "stride": 0}
    return {
        "version": "1.0",
        "truncation": cut,
        "padding": None,
        "added_tokens": _added(tok),
        "normalizer": {"type": "BertNormalizer", "clean_text": True,
                       "handle_chinese_chars": tok.tokenize_chinese_chars,
                       "strip_accents": tok.strip_accents, "lowercase": tok.lowercase},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": _post_processor(tok),
        "decoder": {"type": "WordPiece", "prefix": CONTINUATION, "cleanup": True},
        "model": {"type": "WordPiece", "unk_token": UNK, "continuing_subword_prefix": CONTINUATION,
                  "max_input_chars_per_word": tok.max_input_chars_per_word,
                  "vocab": {t: i for i, t in enumerate(tok.ids_to_tokens)}},
    }


def write_tokenizer_json(tok: Tokenizer, directory, max_length: int | None = None) -> Path:
    """Write `directory`/tokenizer.json for `tok` (cutting texts at `max_length` tokens if given); returns its path."""
    path = Path(directory) / TOKENIZER_JSON
    # whole or not at all (bertkit.data.atomic): `finetune embed --static` saves each better epoch over the last,
    # and a kill or a full disk in this write left the folder's model unloadable ("tokenizer.json is not valid JSON")
    write_lines(path, [json.dumps(tokenizer_json(tok, max_length), ensure_ascii=False) + "\n"])
    return path


def truncation_length(path) -> int | None:
    """Where the tokenizer.json at `path` (or in the folder `path`) cuts a text: its truncation's
    max_length, None when it cuts nothing."""
    path = Path(path)
    data = _read(path / TOKENIZER_JSON if path.is_dir() else path)[0]
    cut = data.get("truncation")
    if cut is None:
        return None
    if not isinstance(cut, dict) or not isinstance(cut.get("max_length"), int) or cut["max_length"] < 1:
        raise BertkitError(f"{path}: truncation must be null or hold a positive max_length, got {cut!r}")
    return cut["max_length"]


def _read(path: Path) -> tuple[dict, str]:
    """The tokenizer.json at `path` (a file or the folder holding one): (its object, its text)."""
    if path.is_dir():
        path = path / TOKENIZER_JSON
    if not path.is_file():
        raise BertkitError(f"no {TOKENIZER_JSON} at {path}: a static model's folder holds its tokenizer there")
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BertkitError(f"{path} is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise BertkitError(f"{path} must hold a JSON object (a Hugging Face tokenizer.json)")
    return data, text


def read_tokenizer_json(path) -> Tokenizer:
    """Our Tokenizer from a tokenizer.json (or the folder holding one). Special tokens the
    vocabulary lacks are added after its last id (`tokens_from_tokenizer_json(complete=True)`)."""
    path = Path(path)
    data, text = _read(path)
    source = str(path / TOKENIZER_JSON if path.is_dir() else path)
    tokens = tokens_from_tokenizer_json(text, source, complete=True)
    return Tokenizer(tokens, **pipeline_settings(data, source))
