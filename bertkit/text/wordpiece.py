"""WordPiece: cut one word into vocabulary pieces, greedy longest-match-first.

Stage two of BERT's tokenizer (google-research/bert `tokenization.py`, class
`WordpieceTokenizer`; Schuster & Nakajima 2012, Wu et al. 2016 §4.1). From the
start of the word take the longest prefix that is in the vocabulary, then
continue from where it ended, looking up continuation pieces with the `##`
prefix: "unaffable" -> ["un", "##aff", "##able"].

If some position has no matching piece, the WHOLE word becomes one [UNK] (not
just the rest): the original does this so that a word is either fully covered
or unknown. A word longer than `max_input_chars_per_word` characters is [UNK]
without trying (the original uses 200, Hugging Face 100; the tokenizer takes it
from the checkpoint's tokenizer_config.json, else 100).

Input: a normalised word (from basic_tokenizer). Output: a list of
(start, end) character spans into the word, one per piece, or None for [UNK];
the caller maps spans to tokens and ids and caches the result per word.
"""

CONTINUATION = "##"  # the prefix of a word-internal piece, as vocab.txt writes it (bertkit.text.vocab)


def wordpiece_spans(word: str, vocab, max_input_chars_per_word: int = 100, max_piece_len: int | None = None):
    """The piece spans of `word`, or None when it must become a single [UNK].

    `vocab` is anything supporting `in` (a dict or set of tokens).
    `max_piece_len` (longest token in characters, ## excluded) only bounds the
    search; it does not change the result.
    """
    n = len(word)
    if n > max_input_chars_per_word:
        return None
    spans = []
    start = 0
    while start < n:
        end = n if max_piece_len is None else min(n, start + max_piece_len)
        prefix = CONTINUATION if start > 0 else ""
        while end > start:
            if prefix + word[start:end] in vocab:
                break
            end -= 1
        else:
            return None  # no piece starts here: the whole word is unknown
        spans.append((start, end))
        start = end
    return spans


def wordpiece(word: str, vocab, max_input_chars_per_word: int = 100, unk_token: str = "[UNK]") -> list[str]:
    """The pieces of `word` as strings: ["un", "##aff", "##able"] or [unk_token]."""
    spans = wordpiece_spans(word, vocab, max_input_chars_per_word)
    if spans is None:
        return [unk_token]
    return [(CONTINUATION if s > 0 else "") + word[s:e] for s, e in spans]
