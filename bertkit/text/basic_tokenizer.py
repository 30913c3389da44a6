"""Basic tokenization: clean the text, normalise case and accents, split into words.

This is stage one of BERT's tokenizer (google-research/bert `tokenization.py`,
class `BasicTokenizer`; Hugging Face `tokenizers` BertNormalizer +
BertPreTokenizer). It turns raw text into "words" that WordPiece then cuts
into pieces:

1. clean: drop NUL, U+FFFD and control characters (Unicode category C*, except
   tab/newline/CR, which count as whitespace); every whitespace becomes a space;
2. CJK ideographs become words of their own (the CJK Unified Ideographs blocks,
   not Hangul or kana, which are written with spaces);
3. uncased vocabularies: strip accents (NFD, drop combining marks Mn) and
   lower-case; cased vocabularies keep the text exactly;
4. split on whitespace, and make each punctuation character a word: ASCII
   symbols (`$`, `+`, `^`, ... are not Unicode P* but count) and Unicode P*.

Output: a list of words, each a pair (normalised word, origin) where origin[i]
is the index in the ORIGINAL text of the character that produced the word's
i-th character; that is how every token later gets its character offsets.

Deviations, all to match the `tokenizers` library (the reference of the parity
tests) where it differs from the original Python:
- accents are stripped before lower-casing, one character at a time, so a
  final capital sigma becomes "σ", not the context-dependent "ς" of str.lower();
- U+2028/U+2029 (line/paragraph separators) split words, as str.split() did in
  the original.
Where `tokenizers` differs from the original we keep the original: character
classes come from Python's unicodedata (Unicode 14 in Python 3.11), while
`tokenizers` uses older tables for marks and punctuation, and it starts CJK
Extension E at U+2B920 instead of U+2B820. That touches 759 rare code points
(listed in tests/test_tokenizer_properties.py); no line of the shared data sets.

`basic_words` below is the plain, readable algorithm. The tokenizer runs a
faster equivalent: `coarse_split_pattern()` cuts text at characters that are
word boundaries whatever their neighbours, and only the pieces between them
(which repeat: "the", "said") go through `basic_words` once, then a cache.
A test proves the two agree on random Unicode.
"""

import re
import unicodedata

# The CJK blocks the original treats as Chinese characters (tokenization.py
# `_is_chinese_char`): Unified Ideographs, Extensions A-E, Compatibility
# Ideographs (+ Supplement).
CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


def is_whitespace(ch: str) -> bool:
    """Space, tab, newline, CR, any Zs space, and the line/paragraph separators."""
    if ch in " \t\n\r":
        return True
    return unicodedata.category(ch) in ("Zs", "Zl", "Zp")


def is_control(ch: str) -> bool:
    """Characters the cleaner drops: category C* except tab/newline/CR (whitespace)."""
    if ch in "\t\n\r":
        return False
    return unicodedata.category(ch).startswith("C")


def is_punctuation(ch: str) -> bool:
    """ASCII non-alphanumeric symbols and every Unicode P* character."""
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in CJK_RANGES)


def normalize_char(ch: str, lowercase: bool, strip_accents: bool) -> str:
    """What one original character becomes: '' (dropped), ' ' (whitespace) or text."""
    if ch == "\x00" or ch == "\ufffd" or is_control(ch):
        return ""
    if is_whitespace(ch):
        return " "
    if strip_accents:
        ch = "".join(c for c in unicodedata.normalize("NFD", ch) if unicodedata.category(c) != "Mn")
    if lowercase:
        ch = "".join(c.lower() for c in ch)  # per character: no final-sigma context
    return ch


def basic_words(
    text: str,
    lowercase: bool = True,
    strip_accents: bool | None = None,
    tokenize_chinese_chars: bool = True,
) -> list[tuple[str, list[int]]]:
    """Split text into normalised words, each with the origin index of every character.

    strip_accents None follows lowercase, as in the original. Example:
    basic_words("Héllo, 世界!") -> [("hello", [0,1,2,3,4]), (",", [5]),
    ("世", [7]), ("界", [8]), ("!", [9])].
    """
    if strip_accents is None:
        strip_accents = lowercase
    words: list[tuple[str, list[int]]] = []
    chars: list[str] = []
    origin: list[int] = []

    def flush():
        if chars:
            words.append(("".join(chars), origin.copy()))
            chars.clear()
            origin.clear()

    for i, raw in enumerate(text):
        if tokenize_chinese_chars and is_cjk(raw):
            # CJK characters are split off before any normalisation (as the
            # original does); NFD maps compatibility ideographs to ideographs.
            flush()
            norm = normalize_char(raw, lowercase, strip_accents)
            words.append((norm, [i] * len(norm)))
            continue
        for ch in normalize_char(raw, lowercase, strip_accents):
            if ch == " ":
                flush()
            elif is_punctuation(ch):
                flush()
                words.append((ch, [i]))
            else:
                chars.append(ch)
                origin.append(i)
    flush()
    return words


def _char_class(chars: list[int]) -> str:
    """A regex character class for a sorted list of code points, as ranges."""
    parts = []
    start = prev = None
    for cp in chars:
        if prev is not None and cp == prev + 1:
            prev = cp
            continue
        if start is not None:
            parts.append((start, prev))
        start = prev = cp
    if start is not None:
        parts.append((start, prev))
    out = []
    for lo, hi in parts:
        out.append(re.escape(chr(lo)) if lo == hi else f"{re.escape(chr(lo))}-{re.escape(chr(hi))}")
    return "[" + "".join(out) + "]"


_PATTERNS: dict = {}


def coarse_split_pattern(split_cjk: bool = True) -> re.Pattern:
    """A regex whose matches are runs between safe word boundaries.

    A character is a *safe boundary* when it ends a word whatever the options
    and neighbours: whitespace, punctuation, or CJK (only when `split_cjk`, the
    tokenizer's tokenize_chinese_chars: else an ideograph is part of its word)
    that no normalisation (lower-casing, NFD) changes. Matches are either one
    safe punctuation/CJK character (a word by itself) or a maximal run of other
    characters (which `basic_words` may still split or shrink, e.g. a run
    holding U+037E GREEK QUESTION MARK, whose NFD is ';'). Whitespace is never
    matched. Built once per process and setting from unicodedata (a pass over the code points below U+20000:
    too slow to repeat per call).
    """
    if split_cjk not in _PATTERNS:
        space, single = [], []
        # P* characters all live below U+20000; CJK ranges are added whole.
        for cp in range(0x20000):
            ch = chr(cp)
            if unicodedata.decomposition(ch) or ch.lower() != ch:
                continue
            if is_whitespace(ch):
                space.append(cp)
            elif is_punctuation(ch) or (split_cjk and is_cjk(ch)):
                single.append(cp)
        single_class = _char_class(sorted(single))
        if split_cjk:
            # the supplementary-plane ideograph blocks, as ranges (no decompositions;
            # the compatibility supplement U+2F800.. has them and stays in the runs)
            supp = "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in CJK_RANGES if 0x20000 <= lo < 0x2F800)
            single_class = single_class[:-1] + supp + "]"
        boundary = single_class[:-1] + _char_class(space)[1:]
        _PATTERNS[split_cjk] = re.compile(f"{single_class}|[^{boundary[1:]}+")
    return _PATTERNS[split_cjk]
