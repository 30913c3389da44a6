"""Sentence splitting: cut a paragraph of free text into sentences.

BERT's pre-training pairs are built from "sentences" (google-research/bert
`create_pretraining_data.py` expects one per line), so paragraphs of running
text, such as the hard-wrapped Project Gutenberg books, must first be cut at
sentence ends. This is a small rule-based splitter of our own (no runtime
dependency), in the spirit of Punkt and pysbd:

a sentence ends after `.`, `!`, `?`, `...` or `…` (or the danda `।`, Arabic `؟`,
Urdu `۔`; plus any closing quotes or brackets that follow) when whitespace comes
next and the next word starts a sentence: an upper-case letter, a letter of a
script without case, or a digit, possibly behind opening quotes or brackets.
Chinese and Japanese sentences end after `。`, `！` or `？` (and their closers)
whatever follows, space or not. Not a sentence end:
- a title or common abbreviation before the dot (`Mr.`, `Dr.`, `St.`, `e.g.`,
  `No.`, `vol.`...; the list `ABBREVIATIONS`);
- a single-letter initial (`J. R. R. Tolkien`, `George W. Bush`);
- a dotted acronym (`U.S.`, `a.m.`): ambiguous, we keep the sentence whole;
- a decimal number or a dot inside a word (`3.14`, `www.example.com`): no
  whitespace follows;
- a lower-case continuation (`"Stop!" he said.`, `wait... and then`).

Input: one paragraph (any internal newlines count as spaces). Output: a list of
stripped, non-empty sentence strings whose concatenation (with single spaces,
none after a full-width end that had none) is the input with its whitespace runs
collapsed: nothing is ever dropped.
"""

import re

# Words whose trailing dot is (almost) never a sentence end: titles that come
# before a name, and abbreviations that come before a number or a noun. Compared
# lower-case, without the final dot. "etc." is left out on purpose: it ends
# sentences as often as not, so it follows the ordinary rule.
ABBREVIATIONS = frozenset(
    """
    mr mrs ms messrs mme mlle dr prof rev hon st sr jr gen col maj capt lt sgt cmdr adm gov
    pres sen rep supt insp esq mt ft fr bros no nos vol vols pp fig figs ch chap art sec
    e.g i.e cf vs viz al approx dept est jan feb mar apr jun jul aug sep sept oct nov dec
    """.split()
)

# The ends of Chinese and Japanese sentences: full-width (and half-width) stops, written with no space after
# them, in a script without capitals; a sentence ends there whatever follows.
_WIDE_ENDS = "。！？｡"
_CLOSERS = "\"'”’»)]」』）》〉】〕"
# A candidate end: terminal punctuation (also the danda of Hindi, the Arabic question mark and the Urdu full
# stop), then closing quotes/brackets, then whitespace (lookahead, so the whitespace stays between the
# sentences); or a full-width end with its closers, whatever follows.
_CANDIDATE = re.compile(rf"(?:[.!?।॥؟۔]+|…+)[{re.escape(_CLOSERS)}]*(?=\s)|[{_WIDE_ENDS}]+[{re.escape(_CLOSERS)}]*")
_OPENERS = "\"'“‘«([¿¡「『（《"
_ACRONYM = re.compile(r"^(?:[^\W\d_]\.)+[^\W\d_]$")  # "U.S" / "a.m" without the final dot
_SPACES = re.compile(r"\s+")


def _starts_sentence(text: str, j: int) -> bool:
    """Does the word at text[j:] look like the start of a sentence?"""
    n = len(text)
    while j < n and text[j] in _OPENERS:
        j += 1
    if j >= n:
        return False
    ch = text[j]
    # a letter without case (Arabic, Hebrew, Devanagari, Thai, CJK) can start one: with capitals alone a
    # text in those scripts was never split, every paragraph one "sentence"
    return ch.isupper() or ch.isdigit() or (ch.isalpha() and ch.lower() == ch.upper())


def _word_before(text: str, end: int) -> str:
    """The whitespace-delimited word ending at text[end] (exclusive), minus openers."""
    start = text.rfind(" ", 0, end) + 1
    return text[start:end].lstrip(_OPENERS)


def _is_abbreviation(word: str) -> bool:
    if not word:
        return False
    low = word.lower()
    if low in ABBREVIATIONS:
        return True
    if len(word) == 1 and word.isalpha():
        return True  # an initial: "J. Smith"
    return bool(_ACRONYM.match(word))


def split_sentences(paragraph: str) -> list[str]:
    """Split one paragraph of text into sentences (see the module docstring)."""
    text = _SPACES.sub(" ", paragraph).strip()
    if not text:
        return []
    sentences = []
    start = 0
    for m in _CANDIDATE.finditer(text):
        end = m.end()
        after = end + 1 if text[end:end + 1] == " " else end  # where the next sentence would start
        if after >= len(text):
            continue
        if m.group(0)[0] not in _WIDE_ENDS and not _starts_sentence(text, after):
            continue
        punct = m.group(0).rstrip(_CLOSERS)
        if punct == ".":
            # Only a single dot can be an abbreviation's; "!", "?" and "..." cannot.
            if _is_abbreviation(_word_before(text, m.start())):
                continue
        sentences.append(text[start:end])
        start = after
    if start < len(text):
        sentences.append(text[start:])
    return sentences
