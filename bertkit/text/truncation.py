"""Truncation: which tokens of one text or a pair fit the model's input, and the windows that overflow.

Follows the `tokenizers` library (the reference of the parity tests). Strategies:
longest_first gives each segment its share at once (the shorter keeps its length
when it fits, else both get half and the longer one, or the second when they tie,
the odd token), where google-research/bert's `_truncate_seq_pair` pops one token
at a time from the longer (ties: the first gets the odd token); only_first and
only_second cut one text and refuse when the other leaves no room. With stride,
the cut-off tokens become overflowing windows that share `stride` tokens with the
previous one (`bertkit.text.windows`).

Inputs are segments (`bertkit.text.encoding.Segment`, T_s tokens each) and a
budget of tokens (max_length less the special tokens); outputs are lists of
windows per segment, element 0 being the truncated segment itself.

`pair_heads` reads no more of a long text and its pair than their cut keeps: longest_first keeps at most
`budget` pieces of each, so each side's head (`Tokenizer.head`: a prefix holding more than `budget` pieces,
else the whole text) holds them. One thing about the uncut texts still matters: when both are cut and the
budget is odd, the longer one (the second on a tie) keeps the odd token, so which one is longer is found by
reading both a little further each time, until the shorter one ends: at most about as far as its end.
"""

from bertkit.errors import BertkitError
from bertkit.text.windows import spans

STRATEGIES = ("longest_first", "only_first", "only_second")


def windows(seg, keep: int, stride: int) -> list:
    """seg cut into windows of `keep` tokens sharing `stride` (the first is the kept part)."""
    if keep >= len(seg):
        return [seg]
    if keep == 0:
        # no room at all (max_length == the special tokens): windows of zero
        # tokens cannot advance, so the text is dropped. (`tokenizers` returns
        # the whole text as one overflow, longer than max_length.)
        return [seg.window(0, 0)]
    return [seg.window(a, b) for a, b in spans(len(seg), keep, stride)]


def longest_first_shares(n_a: int, n_b: int, budget: int) -> tuple[int, int]:
    """How many tokens of a and of b longest_first keeps when both together exceed `budget`."""
    # longest_first cuts where there is most to spare, so a short question
    # keeps all its tokens next to a long context (the usual pair).
    short, long_ = min(n_a, n_b), max(n_a, n_b)
    keep_short = short
    keep_long = long_ if short > budget else max(short, budget - short)
    if keep_short + keep_long > budget:
        # both are too long: split the budget, the longer segment gets the odd token
        keep_short = budget // 2
        keep_long = keep_short + budget % 2
    return (keep_short, keep_long) if n_a <= n_b else (keep_long, keep_short)


def truncate(a, b, budget: int, strategy: str, stride: int) -> tuple[list, list]:
    """Lists of windows for a and b (b may be None); element 0 of each is the truncated segment."""
    n_a, n_b = len(a), len(b) if b is not None else 0
    if n_a + n_b <= budget:
        return [a], [b]
    if strategy == "longest_first":
        if b is None:
            return windows(a, budget, stride), [None]
        keep_a, keep_b = longest_first_shares(n_a, n_b, budget)
        return windows(a, keep_a, stride), windows(b, keep_b, stride)
    to_remove = n_a + n_b - budget
    target, name = (a, "first") if strategy == "only_first" else (b, "second")
    if len(target) <= to_remove:
        other = n_a + n_b - len(target)
        raise BertkitError(
            f"cannot truncate only the {name} text: the other text alone has {other} tokens, leaving no room "
            f"in the {budget} tokens max_length allows after the special tokens; use "
            "truncation_strategy='longest_first' or a larger max_length"
        )
    kept = windows(target, len(target) - to_remove, stride)
    return (kept, [b]) if strategy == "only_first" else ([a], kept)


def pair_heads(tok, text: str, pair: str, budget: int) -> tuple[str, str]:
    """Prefixes of `text` and `pair` that longest_first truncation to `budget` pieces (max_length less the
    special tokens) cuts to the same tokens as the whole texts (see the module docstring). `tok`: a
    `bertkit.text.tokenizer.Tokenizer` (its `head` and `ids_batch`)."""
    a, b = tok.head(text, budget), tok.head(pair, budget)
    if len(a) == len(text) and len(b) == len(pair):
        return text, pair
    n_a, n_b = tok.ids_batch([a, b])[1]
    # a cut side holds more than budget pieces; only when both are kept to halves does their order count
    if budget % 2 == 0 or 2 * min(n_a, n_b) <= budget:
        return a, b
    a_longer = _longer(tok, text, pair, a, b, n_a, n_b)
    if a_longer and n_a <= n_b:
        a = tok.head(text, n_b)  # more than n_b pieces, or all of text (which has more)
    elif not a_longer and n_a > n_b:
        b = tok.head(pair, n_a)
    return a, b


def _longer(tok, text: str, pair: str, a: str, b: str, n_a: int, n_b: int) -> bool:
    """Whether `text` has more word pieces than `pair`, from their heads a and b (n_a, n_b pieces; a head
    that is not the whole text holds a lower bound of its count), each read further only while it matters."""
    while True:
        whole_a, whole_b = len(a) == len(text), len(b) == len(pair)
        if whole_a and whole_b:
            return n_a > n_b
        if whole_b and n_a > n_b:
            return True
        if whole_a and n_b >= n_a:
            return False
        n = n_b if whole_b else n_a if whole_a else 2 * max(n_a, n_b)
        if not whole_a:
            a = tok.head(text, n)
            n_a = tok.ids_batch([a])[1][0]
        if not whole_b:
            b = tok.head(pair, n)
            n_b = tok.ids_batch([b])[1][0]
