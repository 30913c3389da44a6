"""Train a WordPiece vocabulary (vocab.txt) from raw text.

BERT's own vocabulary-building code was never released (the paper cites the
WordPiece model of Wu et al. 2016). We follow what Hugging Face `tokenizers`'
WordPieceTrainer does: byte-pair-encoding style merges over the characters of
each word, where a piece that does not start a word carries the `##` prefix,
so the result is a vocabulary the greedy longest-match WordPiece tokenizer
(wordpiece.py) reads directly.

1. Stream the corpus line by line and count words, as the tokenizer's basic
   stage splits them (cleaning, lower-casing and accent stripping unless cased,
   punctuation and CJK split). Files and folders of .txt/.gz are found and read
   as `pretrain prepare` reads them (`bertkit.data.textfiles`; UTF-8 unless the
   `encoding` setting names another). Words longer than the tokenizer's
   max_input_chars_per_word (100) are not counted: the tokenizer makes each one
   [UNK] whole, so pieces learned from them would never be read (a deviation
   from `tokenizers`' trainer, which learns even from a 200 KB base64 line,
   whose every merge rescans it). Only the word counts live in memory, so a corpus
   larger than memory works; past `max_distinct_words` distinct words the
   words seen once are dropped, and if those seen more often still fill over
   nine tenths of it, all but the most frequent nine tenths (an approximation
   that only forgets the rarest).
2. Alphabet: every character seen, both as a word start "c" and as a
   continuation "##c", so every word made of seen characters has a cover;
   but punctuation and (when split) CJK characters, always words of their
   own, get no "##c", which no text could ever produce.
3. Repeat: merge the most frequent adjacent pair of pieces (ties: the pair
   that sorts first, so training is deterministic) into a new piece, as long as
   the pair occurs at least `min_frequency` times and the vocabulary is below
   `vocab_size`.

Output order: [PAD] [UNK] [CLS] [SEP] [MASK], the alphabet, then the merged
pieces in the order they were learned. The vocabulary is larger than
`vocab_size` only when the alphabet alone does not fit.
"""

import contextlib
import heapq
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


from bertkit.text.basic_tokenizer import basic_words, coarse_split_pattern, is_cjk, is_punctuation
from bertkit.errors import BertkitError, int_at_least
from bertkit.data.corpus import (ENCODING_ERRORS, CorpusStats, check_encoding, check_encoding_errors, corpus_files,
                                 read_lines, text_size)
from bertkit.data.outputs import LOCK_FILE, check_output, folder_lock, holds
from bertkit.text.vocab import CONTINUATION, SPECIAL_TOKENS, check_casing, save_vocab_pair


# the tokenizer's max_input_chars_per_word (bertkit.text.wordpiece): a longer word is one [UNK], never cut
LONGEST_WORD = 100


def _opt(default, help, **more):
    return field(default=default, metadata={"help": help, **more})


@dataclass
class VocabTrainingConfig:
    """What `bertkit vocab train` learns and how it reads the corpus (one option each, `bertkit.options`)."""

    vocab_size: int = _opt(30522, "target vocabulary size (BERT's English vocabularies have 30,522)")
    min_frequency: int = _opt(2, "stop merging when the most frequent pair is seen fewer times")
    # a flag turns a True default off: --no-lowercase, or its older spelling --cased
    lowercase: bool = _opt(True, "lower-case the text (and strip accents, unless --strip-accents says otherwise)",
                           flags=["--lowercase", "--cased"])
    strip_accents: bool | None = _opt(None, "strip accents (default: when lower-casing, as BERT's uncased models)")
    tokenize_chinese_chars: bool = _opt(True, "split CJK characters into words of their own")
    max_distinct_words: int = _opt(5_000_000, "distinct words kept in memory; past it the rarest are "
                                   "forgotten, down to 9/10 of it (bounds memory on a huge corpus)")
    encoding: str = _opt("utf-8", "the text encoding of the corpus files, e.g. latin-1 or cp1252")
    encoding_errors: str = _opt("strict", "a line that does not decode: strict (stop, naming it) or replace "
                                "(repair its bad bytes, counted)", choices=ENCODING_ERRORS)

    def validate(self) -> None:
        # named as the flags are (vocab train's options are these fields), as TrainConfig names its own
        int_at_least(self.vocab_size, len(SPECIAL_TOKENS) + 1, "--vocab-size", says=f"an int > {len(SPECIAL_TOKENS)}")
        int_at_least(self.min_frequency, 1, "--min-frequency", says="a positive int")
        int_at_least(self.max_distinct_words, 1000, "--max-distinct-words", says="an int >= {least}")
        check_encoding(self.encoding)
        check_encoding_errors(self.encoding_errors)


def iter_lines(files, progress: bool = False, stats: CorpusStats | None = None, encoding: str = "utf-8",
               errors: str = "strict"):
    """Lines of the files, read lazily by the corpus reader (a corpus larger than memory is fine).

    Binary files are skipped (counted in `stats`); a line that does not decode in `encoding` stops
    with an error naming it and the fixes, or with errors "replace" is repaired and counted, as
    for pre-training (`bertkit.data.corpus.read_lines`).
    """
    stats = CorpusStats() if stats is None else stats
    bar = None
    if progress:
        from tqdm import tqdm  # late: tqdm reads its TQDM_* defaults when imported, after the command's settings
        # the bytes read, not the files' sizes on disk: a .gz corpus ran past 100% (`text_size`); each file moves
        # the bar by at most its estimate, so a gzip of several members never passes the total either
        sizes = [text_size(f) for f in files]
        bar = tqdm(total=sum(sizes), unit="B", unit_scale=True, desc="counting words")
    try:
        for i, f in enumerate(files):
            start, shown = stats.bytes, 0
            for line in read_lines(f, stats, encoding, errors):
                yield line
                if bar is not None:
                    done = min(stats.bytes - start, sizes[i])
                    bar.update(done - shown)
                    shown = done
            if bar is not None:
                bar.update(sizes[i] - shown)  # a binary file skipped, or a short estimate
    finally:  # also on an error: the bar ends its line before the error's line is printed
        if bar is not None:
            bar.close()


def _forget_rarest(runs: Counter, keep: int) -> Counter:
    """The words seen more than once, and of those at most the `keep` most frequent (ties: the first seen).

    Dropping only the words seen once kept every word seen twice: once those alone passed the limit, each
    later line dropped its new words as it counted them, so a word first met past that point (a later book's
    names, a later part's language) was never counted however frequent, and every line rebuilt the whole
    table. Keeping at most nine tenths of the limit leaves room for new words until the next pruning (a
    tenth of the limit later: each pruning's cost is shared by that many new words)."""
    kept = Counter({w: c for w, c in runs.items() if c > 1})
    return Counter(dict(kept.most_common(keep))) if len(kept) > keep else kept


def count_words(lines, config: VocabTrainingConfig) -> Counter:
    """Counts of normalised words, as the tokenizer's basic stage produces them."""
    pattern = coarse_split_pattern(config.tokenize_chinese_chars)
    runs: Counter = Counter()
    for line in lines:
        if not isinstance(line, str):
            raise BertkitError(f"corpus lines must be str, got {type(line).__name__}")
        runs.update(pattern.findall(line))
        if len(runs) > config.max_distinct_words:
            runs = _forget_rarest(runs, config.max_distinct_words * 9 // 10)
    # runs are raw text between safe boundaries; normalise each distinct one once
    words: Counter = Counter()
    for run, c in runs.items():
        for word, _ in basic_words(run, config.lowercase, config.strip_accents, config.tokenize_chinese_chars):
            if len(word) <= LONGEST_WORD:
                words[word] += c
    return words


def _join(a: str, b: str) -> str:
    return a + b[len(CONTINUATION):]


def _merge(syms: list[str], pair: tuple[str, str], new: str) -> list[str]:
    """syms with every occurrence of `pair` (left to right, not overlapping) replaced by `new`."""
    merged, j = [], 0
    while j < len(syms):
        if j + 1 < len(syms) and syms[j] == pair[0] and syms[j + 1] == pair[1]:
            merged.append(new)
            j += 2
        else:
            merged.append(syms[j])
            j += 1
    return merged


def _merge_everywhere(pair, new: str, words: list, counts: list, pair_counts: dict, where: dict, heap: list) -> None:
    """Merge `pair` into `new` in every word holding it; update the pair counts, their words and the heap.

    Only the pairs next to a merge change count: those are pushed again (not every pair of every touched
    word, which filled the heap with stale entries, most of the time spent on a long random word), and
    only pairs holding `new` are new to a word's `where` entries."""
    delta: Counter = Counter()
    for i in sorted(where.pop(pair, ())):
        syms, c = words[i], counts[i]
        merged = _merge(syms, pair, new)
        if len(merged) == len(syms):
            continue  # no longer holds the pair (an earlier merge took it)
        words[i] = merged
        for p in zip(syms, syms[1:]):
            delta[p] -= c
        for p in zip(merged, merged[1:]):
            delta[p] += c
            if new in p:
                where.setdefault(p, set()).add(i)
    for p, d in delta.items():
        if d == 0:
            continue
        n = pair_counts.get(p, 0) + d
        if n > 0:
            pair_counts[p] = n
            heapq.heappush(heap, (-n, p))
        else:
            pair_counts.pop(p, None)
            where.pop(p, None)


def learn_vocab(word_counts: dict, config: VocabTrainingConfig, progress: bool = False) -> list[str]:
    """The vocabulary (list of tokens, id order) learned from word counts."""
    config.validate()
    # deterministic order of words, whatever order the counts came in
    items = sorted(word_counts.items())
    words = [[w[0]] + [CONTINUATION + c for c in w[1:]] for w, _ in items]
    counts = [c for _, c in items]

    alphabet = sorted({c for w, _ in items for c in w})
    tokens = list(SPECIAL_TOKENS)
    tokens += [c for c in alphabet if c not in SPECIAL_TOKENS]
    # a continuation piece for every character that can follow inside a word: not punctuation nor (when
    # split) CJK, which are always words of their own (their "##" forms could never be read)
    inner = {c for w, _ in items for c in w[1:]}
    tokens += [CONTINUATION + c for c in alphabet
               if c in inner or not (is_punctuation(c) or (config.tokenize_chinese_chars and is_cjk(c)))]
    known = set(tokens)

    pair_counts: dict = {}
    where: dict = {}
    for i, syms in enumerate(words):
        for pair in zip(syms, syms[1:]):
            pair_counts[pair] = pair_counts.get(pair, 0) + counts[i]
            where.setdefault(pair, set()).add(i)
    heap = [(-c, p) for p, c in pair_counts.items()]
    heapq.heapify(heap)

    bar = None
    if progress:
        from tqdm import tqdm  # late: tqdm reads its TQDM_* defaults when imported, after the command's settings
        bar = tqdm(total=max(0, config.vocab_size - len(tokens)), desc="merging pieces")
    while len(tokens) < config.vocab_size and heap:
        neg, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -neg:
            continue  # stale heap entry: the count changed since it was pushed
        if -neg < config.min_frequency:
            break
        new = _join(*pair)
        if new not in known:
            known.add(new)
            tokens.append(new)
            if bar is not None:
                bar.update(1)
        _merge_everywhere(pair, new, words, counts, pair_counts, where, heap)
    if bar is not None:
        bar.close()
    return tokens


def train_vocab(lines, config: VocabTrainingConfig | None = None, progress: bool = False) -> list[str]:
    """Train a vocabulary from an iterable of text lines (read lazily)."""
    config = config or VocabTrainingConfig()
    config.validate()
    if isinstance(lines, (str, bytes)):
        raise BertkitError("train_vocab takes an iterable of lines, not one str; use train_vocab_from_files for paths")
    counts = count_words(lines, config)
    if not counts:
        raise BertkitError("the corpus has no words: nothing to learn a vocabulary from")
    return learn_vocab(counts, config, progress)


def train_vocab_from_files(paths, config: VocabTrainingConfig | None = None, progress: bool = False,
                           stats: CorpusStats | None = None, output=None, log=None) -> list[str]:
    """Train a vocabulary from text files and folders of .txt/.gz files, streaming; `stats` counts skips;
    `output` (where it will be saved) is not read as corpus; `log` (e.g. print) is handed the files read and
    what was skipped, when anything was."""
    config = config or VocabTrainingConfig()
    config.validate()
    stats = CorpusStats() if stats is None else stats
    files = corpus_files(paths, skip=() if output is None else (vocab_file(output),))
    counts = count_words(iter_lines(files, progress, stats, config.encoding, config.encoding_errors), config)
    if not counts:
        reasons = stats.describe_skips() or "the files hold no words"
        raise BertkitError(f"the corpus has no words to learn a vocabulary from ({len(files)} file(s); {reasons})")
    tokens = learn_vocab(counts, config, progress)
    if log is not None and stats.skips:
        log(f"read {stats.files} file(s); {stats.describe_skips()}")
    if log is not None and len(tokens) != config.vocab_size:
        log(size_note(tokens, counts, config))
    return tokens


def size_note(tokens: list[str], counts: dict, config: VocabTrainingConfig) -> str:
    """Why the vocabulary learned from word `counts` has another size than --vocab-size: the alphabet alone
    is larger (every character seen, and its ## form, is kept so that no character of the corpus is [UNK]), or
    merging ran out of pairs (every word already whole, or no pair seen --min-frequency times). Without it a
    user who asked for 8000 tokens and got 544 (a corpus too small for them) was told only the count."""
    asked = f"{len(tokens):,} tokens, {'more' if len(tokens) > config.vocab_size else 'fewer'} than --vocab-size " \
            f"{config.vocab_size}"
    if len(tokens) > config.vocab_size:
        return (f"note: {asked}: the corpus has {len({c for w in counts for c in w}):,} distinct characters, kept "
                "with their ## forms (and the special tokens) so that none of them reads as [UNK]; no pieces were "
                "merged")
    if set(counts) <= set(tokens):
        return f"note: {asked}: every word of the corpus is a token already, there is nothing left to merge"
    return (f"note: {asked}: no pair of pieces is seen --min-frequency {config.min_frequency} times or more any "
            "more (the corpus is small for this size); lower --min-frequency or add text")


PREPARED_DATA = ("manifest.json", "instances", "tokens")  # what `pretrain prepare` writes beside its vocab.txt


def vocab_file(output) -> Path:
    """Where `output` (a file path, or a folder) puts vocab.txt, refused in a folder that holds a model or a
    run (its vocab.txt and tokenizer_config.json would no longer match its weights), prepared pre-training
    data (nor its token ids) or a tokenizer.json (transformers would read that instead). Check it before
    training."""
    out = Path(output)
    if out.is_dir() or out.suffix == "":
        out = out / "vocab.txt"
    held = holds(out.parent)
    if held is not None and held[0] in ("a model", "a run"):
        raise BertkitError(f"{out.parent} holds {held[0]} ({', '.join(held[1][:3])}): a new vocab.txt and "
                           "tokenizer_config.json there would no longer match its weights; write to another folder")
    prepared = [n for n in PREPARED_DATA if (out.parent / n).exists()]
    if prepared:
        raise BertkitError(f"{out.parent} holds prepared pre-training data ({', '.join(prepared)}): its token ids "
                           "index the vocab.txt there, a new one would no longer match them; write to another folder")
    if out.name == "vocab.txt" and (out.parent / "tokenizer.json").exists():
        raise BertkitError(f"{out.parent} holds a tokenizer.json, which transformers reads before vocab.txt: the "
                           "new vocabulary would be bertkit's alone; write to another folder or remove the file")
    return out


def check_vocab_output(output, overwrite: bool) -> Path:
    """`vocab_file`, and refused (unless `overwrite`) where an earlier run's vocab.txt or tokenizer_config.json
    would be replaced: a second `vocab train` there wrote its vocabulary and casing over the first's unasked
    (another file name in that folder still replaces the tokenizer_config.json they share)."""
    out = vocab_file(output)
    check_output(out.parent, overwrite=overwrite, kinds={"a vocabulary": (out.name, "tokenizer_config.json")},
                 call="save_trained_vocab")
    return out


@contextlib.contextmanager
def vocab_output(output, overwrite: bool):
    """`bertkit vocab train`'s vocab.txt for the run, checked (`check_vocab_output`) and its folder locked
    (`bertkit.data.lock`) from before the corpus is read until the vocabulary is saved, as every command that
    writes a folder holds it. Two `vocab train -o X` at once both passed the check and trained, for as long as
    the corpus takes; the second to finish was refused ("X already holds a vocabulary"), its vocabulary lost,
    or with --overwrite replaced the first's unseen. The second is refused at its start now, in one line."""
    out = check_vocab_output(output, overwrite)
    with folder_lock(out.parent, "bertkit vocab train"):
        yield out


def save_trained_vocab(tokens: list[str], output, config: VocabTrainingConfig, overwrite: bool = False) -> Path:
    """Write vocab.txt (at `output`, a file path or a folder; `vocab_file`) and, beside it, the
    tokenizer_config.json that tells the tokenizer how the vocabulary was made (casing, accents); returns
    vocab.txt's path. An earlier vocab.txt or tokenizer_config.json there is refused unless `overwrite`, as
    `bertkit vocab train` refuses it without --overwrite (`check_vocab_output`)."""
    out = check_vocab_output(output, overwrite)
    if not config.lowercase:
        # the tokenizer refuses a cased vocabulary with no capitals as uncased (vocab.check_casing): a --cased run on
        # lower-cased text wrote one, and every command that loaded it (vocab check, tokenize, pretrain prepare) stopped
        try:
            check_casing(tokens, lowercase=False)
        except BertkitError:
            raise BertkitError("the corpus has no capitalised words, so a --cased vocabulary of it would be refused "
                               "as uncased wherever it is loaded; train it without --cased (lower-casing changes "
                               "nothing in such text; add --no-strip-accents to keep accents)") from None
    settings = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": config.lowercase,
        "strip_accents": config.strip_accents,
        "tokenize_chinese_chars": config.tokenize_chinese_chars,
        "model_max_length": 512,
    }
    # one pair (`save_vocab_pair`): a stop between two writes left a vocab.txt beside another run's casing
    return save_vocab_pair(tokens, out, settings, replaceable=(LOCK_FILE,))
