"""tokenizer_config.json and tokenizer.json: the Hugging Face keys a BERT tokenizer folder sets, read as
`Tokenizer`'s settings.

transformers' BertTokenizer reads do_lower_case, strip_accents, tokenize_chinese_chars and
max_input_chars_per_word from tokenizer_config.json (`tokenization_bert.py`); `Tokenizer.from_pretrained`
takes the same keys. Each value must have its JSON type: Python's `bool("false")` is True, so a quoted flag
read loosely would silently turn lower-casing on. The special tokens it names (unk_token, ...) must be
BERT's own, which is all bertkit uses: transformers maps unknown words to whatever unk_token says.
Tokens added beyond the vocabulary are listed in its added_tokens_decoder (or, from transformers 4's slow
tokenizer, in added_tokens.json beside it): `added_tokens` collects them for `vocab.check_added_tokens`.
Any other key is left to its reader.

A folder with a tokenizer.json and no tokenizer_config.json (the Rust tokenizer's own save) states the
same settings in its pipeline: the BertNormalizer's flags and the WordPiece model's
max_input_chars_per_word (`pipeline_settings`), as transformers then reads them.
"""

import json
from pathlib import Path

from bertkit.errors import BertkitError


# each reads one JSON value, or raises TypeError naming what it should be: bool("false") is True, so a
# quoted flag would silently turn lower-casing on
def _flag(value) -> bool:
    if value is None or isinstance(value, bool):
        return bool(value)
    raise TypeError("true or false")


def _flag_or_unset(value) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise TypeError("true, false or null")


def _positive_int(value) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise TypeError("a positive whole number")


# a Hugging Face tokenizer_config.json key -> our constructor's argument and its type (a null
# strip_accents is unset: it follows the casing; a null do_lower_case is false, as in transformers)
_CONFIG_KEYS = {
    "do_lower_case": ("lowercase", _flag),
    "strip_accents": ("strip_accents", _flag_or_unset),
    "tokenize_chinese_chars": ("tokenize_chinese_chars", _flag),
    "max_input_chars_per_word": ("max_input_chars_per_word", _positive_int),
}


# the Hugging Face key of each special token, in `bertkit.text.vocab.SPECIAL_TOKENS`' order
SPECIAL_KEYS = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")


def check_special_tokens(config: dict, config_file, special_tokens) -> None:
    """Refuse a tokenizer_config.json naming another special token than BERT's (`special_tokens`, in
    SPECIAL_KEYS' order): its ids would silently differ from transformers'. A token is a string or an
    AddedToken object ({"content": ...}); null or absent leaves the token as it is."""
    for key, ours in zip(SPECIAL_KEYS, special_tokens):
        value = config.get(key)
        token = value.get("content") if isinstance(value, dict) else value
        if token is not None and token != ours:
            raise BertkitError(f"{config_file}: {key} is {json.dumps(token)[:40]}, but bertkit uses {ours} for it "
                               f"(BERT's special tokens only); rename the token to {ours} or remove the key")


def settings_from(config: dict, config_file, special_tokens=()) -> dict:
    """Our constructor's settings from a tokenizer_config.json's keys, each of its JSON type; the special
    tokens it names must be `special_tokens` (`check_special_tokens`)."""
    check_special_tokens(config, config_file, special_tokens)
    settings = {}
    for key, (name, kind) in _CONFIG_KEYS.items():
        if key in config:
            try:
                settings[name] = kind(config[key])
            except TypeError as err:
                raise BertkitError(f"{config_file}: {key} must be {err}, got {json.dumps(config[key])[:40]}; "
                                   "fix the file") from None
    return settings


def pipeline_settings(data: dict, source) -> dict:
    """Our constructor's settings from a tokenizer.json's object (its normalizer and WordPiece model); an
    error for another pipeline than BERT's. strip_accents null follows lowercase, in both libraries."""
    norm, pre, model = data.get("normalizer") or {}, data.get("pre_tokenizer") or {}, data.get("model") or {}
    if norm.get("type") != "BertNormalizer" or pre.get("type") != "BertPreTokenizer":
        raise BertkitError(f"{source} has a {norm.get('type')} normalizer and a {pre.get('type')} pre-tokenizer; "
                           "bertkit reads BERT's (BertNormalizer, BertPreTokenizer) only")
    strip = norm.get("strip_accents")
    return {"lowercase": bool(norm.get("lowercase", True)),
            "strip_accents": None if strip is None else bool(strip),
            "tokenize_chinese_chars": bool(norm.get("handle_chinese_chars", True)),
            "max_input_chars_per_word": int(model.get("max_input_chars_per_word", 100))}


def read_config(folder: Path) -> tuple[dict, Path]:
    """The object of `folder`'s tokenizer_config.json ({} when there is none) and the file's path."""
    config_file = folder / "tokenizer_config.json"
    config = _read_json(config_file, "a JSON object of settings") if config_file.is_file() else {}
    return config, config_file


def added_tokens(config: dict, folder: Path) -> dict[Path, dict]:
    """Tokens transformers added beyond the vocabulary, by where they are listed: {source: {token: id}}, from
    tokenizer_config.json's added_tokens_decoder (id -> {"content": token}) and added_tokens.json."""
    found = {}
    decoder = config.get("added_tokens_decoder") or {}
    if isinstance(decoder, dict):
        found[folder / "tokenizer_config.json"] = {v.get("content"): int(k) if k.isdigit() else k
                                                   for k, v in decoder.items() if isinstance(v, dict)}
    extra = folder / "added_tokens.json"
    if extra.is_file():
        found[extra] = _read_json(extra, "a JSON object of token -> id")
    return found


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BertkitError(f"{path} is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise BertkitError(f"{path} must hold {what}, got {type(data).__name__}")
    return data
