"""tokenizer_config.json: the Hugging Face keys a BERT tokenizer folder sets, read as `Tokenizer`'s settings.

transformers' BertTokenizer reads do_lower_case, strip_accents, tokenize_chinese_chars and
max_input_chars_per_word from it (`tokenization_bert.py`); `Tokenizer.from_pretrained` takes the same
keys. Each value must have its JSON type: Python's `bool("false")` is True, so a quoted flag read
loosely would silently turn lower-casing on. Any other key is left to its reader.
"""

import json

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


def settings_from(config: dict, config_file) -> dict:
    """Our constructor's settings from a tokenizer_config.json's keys, each of its JSON type."""
    settings = {}
    for key, (name, kind) in _CONFIG_KEYS.items():
        if key in config:
            try:
                settings[name] = kind(config[key])
            except TypeError as err:
                raise BertkitError(f"{config_file}: {key} must be {err}, got {json.dumps(config[key])[:40]}; "
                                   "fix the file") from None
    return settings
