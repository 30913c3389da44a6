"""Training a WordPiece vocabulary: a hand-checked run, determinism, streaming, the CLI,
quality on held-out real text, and cased parity with the oracle using a trained vocabulary."""

import json
import random

import pytest

from bertkit.errors import BertkitError
from bertkit.text.tokenizer import Tokenizer
from bertkit.text.vocab import SPECIAL_TOKENS, load_vocab
from bertkit.text.vocab_training import VocabTrainingConfig, count_words, learn_vocab, train_vocab, train_vocab_from_files

TRAIN_BOOKS = slice(0, None, 17)  # 6 of the 102 books, spread over the authors
HELD_OUT_BOOKS = slice(8, None, 17)  # 6 other books
HELD_OUT_LINES = 2000  # per held-out book


def test_hand_checked_merges():
    # words: ab x5, abc x3, bc x1 -> pieces a ##b | a ##b ##c | b ##c
    # pair counts (a,##b)=8 (##b,##c)=3 (b,##c)=1: merge "ab"; then (ab,##c)=3: merge "abc";
    # then (b,##c)=1 < min_frequency 2: stop.
    tokens = learn_vocab({"ab": 5, "abc": 3, "bc": 1}, VocabTrainingConfig(vocab_size=100, min_frequency=2))
    assert tokens == list(SPECIAL_TOKENS) + ["a", "b", "c", "##a", "##b", "##c", "ab", "abc"]
    # with min_frequency 1 the last pair is merged too; a vocab_size cap stops earlier
    assert learn_vocab({"ab": 5, "abc": 3, "bc": 1}, VocabTrainingConfig(vocab_size=100, min_frequency=1))[-1] == "bc"
    assert learn_vocab({"ab": 5, "abc": 3, "bc": 1}, VocabTrainingConfig(vocab_size=12))[-1] == "ab"


def _naive_merges(counts: dict, vocab_size: int, min_frequency: int, tokens: list) -> list:
    """The merges of learn_vocab, recounting every pair at every step: the most frequent, ties to the pair
    that sorts first, until below min_frequency or the vocabulary is full."""
    words = {w: [w[0]] + ["##" + ch for ch in w[1:]] for w in counts}
    tokens = list(tokens)
    while len(tokens) < vocab_size:
        pairs = {}
        for w, syms in words.items():
            for p in zip(syms, syms[1:]):
                pairs[p] = pairs.get(p, 0) + counts[w]
        if not pairs:
            break
        n, best = min((-n, p) for p, n in pairs.items())
        if -n < min_frequency:
            break
        new = best[0] + best[1][2:]
        tokens += [new] if new not in tokens else []
        for w, syms in words.items():
            out, j = [], 0
            while j < len(syms):
                if tuple(syms[j:j + 2]) == best:
                    out.append(new)
                    j += 2
                else:
                    out.append(syms[j])
                    j += 1
            words[w] = out
    return tokens


def test_merges_equal_recounting_every_pair_at_every_step():
    """learn_vocab updates only the pairs next to each merge (a heap of counts); recounting everything
    each step (slow, plain) must learn the same vocabulary, ties included."""
    rng = random.Random(1)
    counts = {"".join(rng.choice("abcab") for _ in range(rng.randint(1, 12))): rng.randint(1, 4) for _ in range(150)}
    for size, least in ((60, 1), (45, 2), (200, 1)):
        ours = learn_vocab(counts, VocabTrainingConfig(vocab_size=size, min_frequency=least))
        start = ours[:len(SPECIAL_TOKENS) + 6]  # the specials and the alphabet a b c, ##a ##b ##c
        assert ours == _naive_merges(counts, size, least, start)


def test_alphabet_always_kept_even_over_size():
    tokens = learn_vocab({"xyz": 1, "q": 1}, VocabTrainingConfig(vocab_size=6, min_frequency=1))
    assert set(tokens) >= {"x", "y", "z", "q", "##x", "##y", "##z", "##q"}
    assert len(tokens) == len(set(tokens))  # every character seen has both forms, no duplicates


@pytest.mark.oracle
def test_no_continuation_piece_that_can_never_follow_in_a_word():
    """Punctuation and CJK are always words of their own, so "##," or "##中" can never be read: they
    took one slot of the vocabulary per such character (thousands on a Chinese corpus). The Rust
    trainer (the oracle) learns none of them; the other characters keep both forms."""
    from tokenizers import BertWordPieceTokenizer

    lines = ["Hello, world! (said she) 中文字 «quoted» — end.", "hello again; world? 文中"] * 3
    ours = train_vocab(lines, VocabTrainingConfig(vocab_size=60, min_frequency=2))
    assert not [t for t in ours if t.startswith("##") and t[2:] in ",!()«»—.;?中文字"]
    assert {"##e", "##l", "##o", "h", "w"} <= set(ours)  # letters: both forms, as before
    rust = BertWordPieceTokenizer()
    rust.train_from_iterator(lines, vocab_size=60, min_frequency=2, show_progress=False,
                             special_tokens=list(SPECIAL_TOKENS), limit_alphabet=1000)
    theirs = {t for t in rust.get_vocab() if t.startswith("##") and len(t) == 3}
    assert theirs <= set(ours)
    # and only the letters seen at word starts alone ("quoted", "said", "world") have more: their cover
    assert {t for t in ours if t.startswith("##") and len(t) == 3} - theirs == {"##q", "##s", "##w"}
    whole = train_vocab(lines, VocabTrainingConfig(vocab_size=60, tokenize_chinese_chars=False))
    assert {"##文", "##中", "##字"} <= set(whole)  # ideographs inside words: continuation pieces again


def test_words_too_long_to_tokenize_teach_nothing():
    """A word over max_input_chars_per_word (100) is one [UNK] to the tokenizer, never cut into pieces, so
    pieces learned from it are never read. One 200 KB base64 line among a corpus made training 80 times
    slower and filled the vocabulary with its fragments; such words are not counted."""
    blob = "qZ8xK2vB7mW4" * 20  # 240 characters, one word
    lines = ["the cat sat on the mat", blob, "the dog sat", blob, blob]
    counts = count_words(lines, VocabTrainingConfig())
    assert counts == {"the": 3, "cat": 1, "sat": 2, "on": 1, "mat": 1, "dog": 1}
    tokens = train_vocab(lines, VocabTrainingConfig(vocab_size=200, min_frequency=1))
    assert not {"q", "z", "##8", "##x"} & set(tokens)  # nothing of the blob, not even its letters
    exactly = "x" * 100  # the longest word the tokenizer still cuts
    assert count_words([exactly, exactly + "y"], VocabTrainingConfig()) == {exactly: 1}


def test_counting_follows_the_basic_tokenizer():
    counts = count_words(["Héllo, WORLD! hello\u4e2d\u6587", "world"], VocabTrainingConfig())
    assert counts == {"hello": 2, ",": 1, "world": 2, "!": 1, "\u4e2d": 1, "\u6587": 1}
    cased = count_words(["Héllo, WORLD!"], VocabTrainingConfig(lowercase=False))
    assert cased == {"Héllo": 1, ",": 1, "WORLD": 1, "!": 1}
    # --no-tokenize-chinese-chars: ideographs stay inside their words, as the tokenizer then reads them
    whole = count_words(["\u4e2d\u6587 a\u4e2d, \u4e2d"], VocabTrainingConfig(tokenize_chinese_chars=False))
    assert whole == {"\u4e2d\u6587": 1, "a\u4e2d": 1, ",": 1, "\u4e2d": 1}


def test_deterministic_and_order_independent():
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefgh") for _ in range(rng.randint(1, 9))) for _ in range(400)]
    lines = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(300)]
    config = VocabTrainingConfig(vocab_size=150)
    first = train_vocab(lines, config)
    shuffled = lines[:]
    rng.shuffle(shuffled)
    assert train_vocab(iter(shuffled), config) == first  # a lazy iterator works: streaming input
    assert len(first) == 150


def test_bounded_memory_keeps_frequent_words():
    # more distinct words than max_distinct_words: words seen once are forgotten, frequent ones stay
    lines = (f"common word{i} common" for i in range(5000))
    counts = count_words(lines, VocabTrainingConfig(max_distinct_words=1000))
    assert counts["common"] == 10000 and len(counts) < 2000


def test_a_word_first_met_past_the_limit_is_counted():
    """Past --max-distinct-words only the words seen once were forgotten: once the words seen twice alone
    passed the limit, the table stayed above it and each line's new words were dropped as it was counted,
    so a word first met from then on (a later book's names) was never counted, however frequent."""
    early = [f"early{i} early{i}" for i in range(1500)]  # 1,500 words seen twice: over the limit of 1,000
    later = [f"zebra later{i}" for i in range(400)]  # then a frequent new word, among rare ones
    counts = count_words(early + later, VocabTrainingConfig(max_distinct_words=1000))
    assert counts["zebra"] >= 390  # all but a few of its first sightings, while it was still rare
    assert len(counts) <= 1000  # and memory stays bounded by the limit


def test_bad_training_input(tmp_path):
    with pytest.raises(BertkitError, match="--vocab-size must be an int"):
        train_vocab(["a b"], VocabTrainingConfig(vocab_size=3))
    with pytest.raises(BertkitError, match="--min-frequency must be a positive int"):
        train_vocab(["a b"], VocabTrainingConfig(min_frequency=0))
    with pytest.raises(BertkitError, match="not one str"):
        train_vocab("a single string")
    with pytest.raises(BertkitError, match="no words"):
        train_vocab(["   ", "\x00"])
    with pytest.raises(BertkitError, match="corpus path not found"):
        train_vocab_from_files([tmp_path / "nope.txt"])
    with pytest.raises(BertkitError, match="holds no .txt files"):
        train_vocab_from_files([tmp_path])


def test_what_was_skipped_is_logged(tmp_path):
    (tmp_path / "a.txt").write_text("the cat sat on the mat\n" * 5)
    (tmp_path / "b.txt").write_bytes(b"\x00\x01\x02" * 100)
    said = []  # at 30 tokens, the size its words give (every word whole): no note on the size
    train_vocab_from_files([tmp_path], VocabTrainingConfig(vocab_size=30, min_frequency=1), log=said.append)
    assert said == ["read 1 file(s); files skipped: binary (NUL bytes or mostly non-text bytes): 1"]
    (tmp_path / "b.txt").unlink()
    train_vocab_from_files([tmp_path], VocabTrainingConfig(vocab_size=30, min_frequency=1), log=said.append)
    assert len(said) == 1  # nothing skipped, nothing said


def test_another_size_than_asked_says_why(tmp_path, capsys):
    """--vocab-size is a target: the alphabet alone may be larger, and a small corpus runs out of pairs to
    merge. vocab train said only 'wrote 544 tokens' to a user who asked for 8000; it now says which, and what
    it says is checked here against the vocabulary itself."""
    from bertkit.cli import main

    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat\nthe dog sat on a log\nxylophone quiz\n" * 3)
    said = []
    config = VocabTrainingConfig(vocab_size=12)
    small = train_vocab_from_files([corpus], config, log=said.append)
    letters = set(corpus.read_text().replace(" ", "").replace("\n", ""))
    assert len(small) == len(SPECIAL_TOKENS) + 2 * len(letters)  # the alphabet alone, no merge
    assert said == [f"note: {len(small)} tokens, more than --vocab-size 12: the corpus has {len(letters)} distinct "
                    "characters, kept with their ## forms (and the special tokens) so that none of them reads as "
                    "[UNK]; no pieces were merged"]
    said.clear()
    whole = train_vocab_from_files([corpus], VocabTrainingConfig(vocab_size=8000), log=said.append)
    assert {"the", "cat", "xylophone", "quiz"} <= set(whole)  # every word, seen 3 times, is whole
    assert said == [f"note: {len(whole)} tokens, fewer than --vocab-size 8000: every word of the corpus is a token "
                    "already, there is nothing left to merge"]
    said.clear()
    corpus.write_text("the cat sat on the mat\nthe dog sat on a log\nxylophone quiz\n")
    rare = train_vocab_from_files([corpus], VocabTrainingConfig(vocab_size=8000, min_frequency=2), log=said.append)
    assert "xylophone" not in rare  # seen once: its pairs are below --min-frequency 2
    assert said == [f"note: {len(rare)} tokens, fewer than --vocab-size 8000: no pair of pieces is seen "
                    "--min-frequency 2 times or more any more (the corpus is small for this size); lower "
                    "--min-frequency or add text"]
    assert len(train_vocab([corpus.read_text()], VocabTrainingConfig(vocab_size=8000, min_frequency=1))) > len(rare)
    said.clear()
    train_vocab_from_files([corpus], VocabTrainingConfig(vocab_size=len(rare)), log=said.append)
    assert said == []  # the size asked: nothing to say
    assert main(["vocab", "train", str(corpus), "-o", str(tmp_path / "v"), "--vocab-size", "8000"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"note: {len(rare)} tokens, fewer than --vocab-size 8000") and out[1].startswith("wrote")


def test_cli_vocab_train(tmp_path, capsys):
    from bertkit.cli import main

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("The cat sat on the mat.\nThe dog sat on the log.\n" * 20)
    (corpus / "b.txt").write_text("A cat and a dog.\n" * 10)
    out = tmp_path / "tok"
    assert main(["vocab", "train", str(corpus), "-o", str(out), "--vocab-size", "40", "--min-frequency", "2"]) == 0
    assert "wrote 40 tokens" in capsys.readouterr().out
    tok = Tokenizer.from_pretrained(out)
    assert len(tok) == 40 and tok.lowercase
    assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is True
    assert tok.tokenize("The cat sat.") == ["the", "cat", "sat", "."]
    assert main(["vocab", "train", str(tmp_path / "missing"), "-o", str(tmp_path / "new")]) == 2
    assert "corpus path not found" in capsys.readouterr().err
    # again into the same folder: refused (test_output_folders), replaced with --overwrite
    assert main(["vocab", "train", str(corpus), "-o", str(out), "--vocab-size", "30"]) == 2
    assert "already holds a vocabulary" in capsys.readouterr().err
    assert main(["vocab", "train", str(corpus), "-o", str(out), "--vocab-size", "30", "--overwrite"]) == 0
    assert len(Tokenizer.from_pretrained(out)) == 30
    # a folder holding a tokenizer.json (a Hugging Face tokenizer's save): transformers reads that file before
    # vocab.txt, so the new vocabulary would be bertkit's only; refused before the corpus is read
    (out / "tokenizer.json").write_text("{}")
    assert main(["vocab", "train", str(tmp_path / "missing"), "-o", str(out)]) == 2
    assert "holds a tokenizer.json, which transformers reads before vocab.txt" in capsys.readouterr().err



def test_cli_vocab_train_into_a_folder_another_run_is_writing_is_refused_at_its_start(tmp_path, capsys):
    """Two `vocab train -o X` at once: both passed the output check and trained; the second to finish was refused
    at its save ("X already holds a vocabulary", with --overwrite it replaced the first's unseen), the corpus read
    for nothing. vocab train holds X's lock (`bertkit.data.lock`) for its run, as every command writing a folder
    does: the second is refused at its start, in one line naming the holder, nothing written; then it runs."""
    from bertkit.cli import main
    from bertkit.data.lock import folder_lock

    corpus, out = tmp_path / "corpus.txt", tmp_path / "tok"
    corpus.write_text("The cat sat on the mat.\nThe dog sat on the log.\n" * 20)
    args = ["vocab", "train", str(corpus), "--vocab-size", "40", "--min-frequency", "2"]
    for output, flags in ((out, []), (out / "my.txt", ["--overwrite"])):
        with folder_lock(out, "bertkit vocab train"):  # the other run, training into X now
            before = {p.name: p.read_bytes() for p in out.iterdir()}
            assert main([*args, "-o", str(output), *flags]) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and err.startswith("bertkit: error: ") and "bertkit vocab train" in err, err
            assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing of this run
        assert main([*args, "-o", str(output), *flags]) == 0  # the other finished: it goes through
        capsys.readouterr()
    assert sorted(p.name for p in out.iterdir()) == ["my.txt", "tokenizer_config.json", "vocab.txt"]

def test_cli_vocab_train_leaves_a_models_vocabulary_alone(tmp_path, capsys):
    # `vocab train corpus/ -o MODEL/` replaced the model's vocab.txt and tokenizer_config.json, which then no
    # longer matched its weights; the corpus path is missing here, so the folder was refused before reading it
    from bertkit.cli import main

    model = tmp_path / "model"
    model.mkdir()
    for name, text in (("config.json", "{}"), ("vocab.txt", "[PAD]\n[UNK]\n"), ("tokenizer_config.json", "{}")):
        (model / name).write_text(text)
    (model / "model.safetensors").write_bytes(b"weights")
    before = {p.name: p.read_bytes() for p in model.iterdir()}
    for output in (model, model / "vocab.txt"):
        assert main(["vocab", "train", str(tmp_path / "missing"), "-o", str(output)]) == 2
        assert capsys.readouterr().err == (f"bertkit: error: {model} holds a model (config.json, model.safetensors): "
                                           "a new vocab.txt and tokenizer_config.json there would no longer match "
                                           "its weights; write to another folder\n")
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before


def test_cli_vocab_train_leaves_prepared_datas_vocabulary_alone(tmp_path, capsys):
    # `pretrain prepare` writes the vocab.txt its token ids index: a new one there (it was replaced without a
    # word) made `pretrain run` on the folder save a model whose vocab.txt does not match its ids
    from bertkit.cli import main

    data = tmp_path / "data"
    (data / "instances").mkdir(parents=True)
    for name, text in (("manifest.json", "{}"), ("vocab.txt", "[PAD]\n[UNK]\n"), ("tokenizer_config.json", "{}")):
        (data / name).write_text(text)
    before = {p.name: p.read_bytes() for p in data.iterdir() if p.is_file()}
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat\n" * 20)
    for output in (data, data / "vocab.txt"):
        assert main(["vocab", "train", str(corpus), "-o", str(output), "--vocab-size", "120"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"bertkit: error: {data} holds prepared pre-training data (manifest.json, instances)")
        assert err.count("\n") == 1 and "write to another folder" in err
    assert {p.name: p.read_bytes() for p in data.iterdir() if p.is_file()} == before


def _random_text(letters: str, seed: int, lines: int = 600) -> str:
    rng = random.Random(seed)
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(800)]
    return "".join(" ".join(rng.choice(words) for _ in range(12)) + " .\n" for _ in range(lines))


@pytest.mark.oracle
def test_cli_cased_vocabulary_of_a_caseless_script_loads(tmp_path, capsys, transformers_mod):
    """A --cased vocabulary of Arabic (or Hebrew, Devanagari, Thai, CJK) text has no capitals, since the
    script has none: the tokenizer's casing check refused it as "uncased" in every command that loaded it
    (vocab check, tokenize, pretrain prepare), though vocab train had just written it. It loads, and reads
    the text as transformers does with the same folder. A --cased vocabulary of lower-cased Latin text is
    refused by vocab train itself (it wrote one the other commands then refused), naming the fix."""
    from bertkit.cli import main

    (tmp_path / "ar.txt").write_text(_random_text("".join(map(chr, range(0x0628, 0x0638))), seed=0))
    out = tmp_path / "ar"
    assert main(["vocab", "train", str(tmp_path / "ar.txt"), "-o", str(out), "--vocab-size", "1200", "--cased"]) == 0
    tokens = load_vocab(out)
    assert len(tokens) == 1200 and sum(t.isalpha() for t in tokens) >= 500  # enough for the casing check to judge
    capsys.readouterr()
    assert main(["vocab", "check", str(out)]) == 0, capsys.readouterr().err
    ours, fast = Tokenizer.from_pretrained(out), transformers_mod.BertTokenizerFast.from_pretrained(str(out))
    assert not ours.lowercase and not fast.do_lower_case
    for line in (tmp_path / "ar.txt").read_text().split("\n")[:50]:
        assert ours.encode(line).input_ids == fast(line)["input_ids"]

    (tmp_path / "lc.txt").write_text(_random_text("abcdefghijklmnop", seed=1))
    latin = tmp_path / "lc"
    assert main(["vocab", "train", str(tmp_path / "lc.txt"), "-o", str(latin), "--vocab-size", "1200", "--cased"]) == 2
    [err] = [line for line in capsys.readouterr().err.splitlines() if "error" in line]  # one line (and tqdm's)
    assert err.startswith("bertkit: error: the corpus has no capitalised words") and "without --cased" in err
    assert not latin.exists()
    assert main(["vocab", "train", str(tmp_path / "lc.txt"), "-o", str(latin), "--vocab-size", "1200"]) == 0
    assert main(["vocab", "check", str(latin)]) == 0


# every line has an accent, 4% of the bytes: below the binary-file threshold, as in real French prose
FRENCH = ["Le café était chaud ce matin, et nous avons parlé de la ville.",
          "Où est la clé de la maison ? Elle est sur la table, dit-il.",
          "Un été à la mer : la fenêtre ouverte, le vent et le sable.",
          "Ça suffit pour aujourd'hui, nous reprendrons demain soir."]


def test_cli_vocab_train_reads_a_latin1_corpus_with_encoding(tmp_path, capsys):
    from bertkit.cli import main

    corpus = tmp_path / "fr.txt"
    corpus.write_bytes(("\n".join(FRENCH * 5) + "\n").encode("latin-1"))  # every line has an accent
    out = tmp_path / "tok"
    # without --encoding: stops, naming the file and the fix, and writes nothing
    assert main(["vocab", "train", str(corpus), "-o", str(out), "--cased", "--vocab-size", "80"]) == 2
    [err] = [line for line in capsys.readouterr().err.splitlines() if "error" in line]  # one line (and tqdm's)
    assert f"{corpus} line 1 is not utf-8 text" in err and "--encoding latin-1" in err
    assert not out.exists()

    assert main(["vocab", "train", str(corpus), "-o", str(out), "--cased", "--vocab-size", "80",
                 "--encoding", "latin-1"]) == 0
    assert "repaired" not in capsys.readouterr().out
    vocab = load_vocab(out / "vocab.txt")
    assert {"é", "à", "Ç", "##é", "##ê"} <= set(vocab)  # accents kept, not replaced by U+FFFD
    assert "\ufffd" not in vocab
    assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is False
    tok = Tokenizer.from_pretrained(out)
    assert "".join(t.removeprefix("##") for t in tok.tokenize("été")) == "été"
    # the same text in cp1252 (where it equals latin-1 but for the typographic quotes)
    (tmp_path / "w.txt").write_bytes("Le café « très » chaud\n".encode("cp1252") * 3)
    assert main(["vocab", "train", str(tmp_path / "w.txt"), "-o", str(tmp_path / "w"), "--cased",
                 "--encoding", "cp1252", "--min-frequency", "1"]) == 0
    assert {"é", "«", "»"} <= set(load_vocab(tmp_path / "w" / "vocab.txt"))
    assert main(["vocab", "train", str(corpus), "-o", str(out), "--encoding", "klingon"]) == 2
    assert "unknown --encoding 'klingon'" in capsys.readouterr().err


def test_cli_vocab_train_refuses_utf8_files_read_as_latin1(tmp_path, capsys):
    """A corpus mixing UTF-8 and latin-1 files stops at the first latin-1 line, advising --encoding latin-1;
    followed, that advice read the UTF-8 files as latin-1 too, without a word: 'café' became the token
    'cafÃ©'. A UTF-8 file read with another encoding stops the command, naming it and the conversion;
    text really in the encodings named (latin-1, cp1251, GBK, Shift-JIS) reads as Python decodes it."""
    from bertkit.cli import main
    from bertkit.data.corpus import CorpusStats, read_lines

    corpus = tmp_path / "mixed"
    corpus.mkdir()
    (corpus / "a.txt").write_text("\n".join(FRENCH) + "\n", encoding="utf-8")
    (corpus / "b.txt").write_bytes(("\n".join(FRENCH[::-1]) + "\n").encode("latin-1"))
    out = tmp_path / "v"
    assert main(["vocab", "train", str(corpus), "-o", str(out), "--cased", "--encoding", "latin-1"]) == 2
    [err] = [line for line in capsys.readouterr().err.splitlines() if "error" in line]  # one line (and tqdm's)
    assert err.startswith(f"bertkit: error: {corpus / 'a.txt'} is UTF-8 text, not latin-1") and "iconv" in err
    assert not out.exists()
    (corpus / "b.txt").write_text((corpus / "b.txt").read_bytes().decode("latin-1"))  # converted, as it says
    assert main(["vocab", "train", str(corpus), "-o", str(out), "--cased", "--min-frequency", "1"]) == 0
    vocab = load_vocab(out)
    assert "café" in vocab and not [t for t in vocab if "Ã" in t]
    for codec, text in (("latin-1", FRENCH[0]), ("cp1251", "Мы были дома. Да."), ("gbk", "我们去公园。天气很好"),
                        ("shift_jis", "今日は晴れ。明日は雨")):
        f = tmp_path / f"{codec}.txt"
        f.write_bytes((text + "\n").encode(codec) * 3)
        assert list(read_lines(f, CorpusStats(), codec)) == [text] * 3


def test_cli_vocab_train_refuses_windows_text_read_as_latin1(tmp_path, capsys):
    """Windows' cp1252 puts ’ “ ” — … at the bytes 0x80-0x9F, which latin-1 (the first encoding the errors
    suggest) reads as invisible control characters, dropped by the tokenizer: such a file read with
    --encoding latin-1 lost its apostrophes and dashes without a word ("don’t" became the word "dont"). It stops,
    naming the line and cp1252, which reads it as Python's codec does."""
    from bertkit.cli import main

    text = "He said \u201cdon\u2019t go\u201d \u2014 then left, caf\u00e9 closed.\n"
    corpus = tmp_path / "win.txt"
    corpus.write_bytes(text.encode("cp1252") * 3)
    out = tmp_path / "v"
    assert main(["vocab", "train", str(corpus), "-o", str(out), "--cased", "--encoding", "latin-1"]) == 2
    [err] = [line for line in capsys.readouterr().err.splitlines() if "error" in line]  # one line (and tqdm's)
    assert err.startswith(f"bertkit: error: {corpus} line 1 has the byte 93") and "--encoding cp1252" in err
    assert not out.exists()
    assert main(["vocab", "train", str(corpus), "-o", str(out), "--cased", "--encoding", "cp1252",
                 "--min-frequency", "1"]) == 0
    assert Tokenizer.from_pretrained(out).tokenize("don\u2019t \u2014") == ["don", "\u2019", "t", "\u2014"]
    assert {"\u201c", "\u2019", "\u2014"} <= set(load_vocab(out)) and "dont" not in load_vocab(out)


def test_stray_bad_bytes_are_repaired_and_counted_not_fatal(tmp_path):
    from bertkit.data.corpus import CorpusStats

    corpus = tmp_path / "crawl.txt"
    # two bad lines in five: a damaged UTF-8 file, not another encoding
    corpus.write_bytes("Le café.\nLa clé.\n".encode() * 2 + b"caf\xe9 noir\n" + "Le thé.\n".encode()
                       + b"\xff\n")
    with pytest.raises(BertkitError, match=r"crawl\.txt line 5 is not utf-8 text \(bytes e9 20 6e 6f\)"):
        train_vocab_from_files([corpus], VocabTrainingConfig(lowercase=False, min_frequency=1))  # the default rule
    stats = CorpusStats()
    repair = VocabTrainingConfig(lowercase=False, min_frequency=1, encoding_errors="replace")
    vocab = train_vocab_from_files([corpus], repair, stats=stats)
    assert stats.skips == {"invalid_utf8_lines": 2} and "é" in vocab
    with pytest.raises(BertkitError, match=r"crawl\.txt is not utf-8 text: 6 of its 11 lines"):
        corpus.write_bytes(corpus.read_bytes() + b"caf\xe9\n" * 4)  # now most lines fail
        train_vocab_from_files([corpus], VocabTrainingConfig(encoding_errors="replace"))


# --- real data: held-out quality and cased parity -------------------------------------


@pytest.fixture(scope="module")
def books(shared_data):
    return sorted((shared_data / "pretrain_corpus" / "gutenberg").glob("*.txt"))


@pytest.fixture(scope="module")
def held_out(books):
    return [line for b in books[HELD_OUT_BOOKS] for line in b.read_text(encoding="utf-8").split("\n")[:HELD_OUT_LINES]]


def _quality(tok, lines):
    tokens = unk = words = 0
    for enc in tok.encode_batch(lines, padding=False, return_tensors=None, truncation=False).encodings:
        ids = enc.input_ids[1:-1]
        tokens += len(ids)
        unk += ids.count(tok.unk_token_id)
        words += len(set(enc.word_ids[1:-1]))
    return unk / tokens, tokens / words


@pytest.mark.data
@pytest.mark.slow
def test_trained_vocab_on_held_out_text(books, held_out, tmp_path):
    tokens = train_vocab_from_files(books[TRAIN_BOOKS], VocabTrainingConfig(vocab_size=8000))
    assert len(tokens) == 8000
    trained = Tokenizer(tokens)
    trained.save_pretrained(tmp_path)
    assert load_vocab(tmp_path / "vocab.txt") == tokens
    unk_rate, per_word = _quality(trained, held_out)
    ref_unk, ref_per_word = _quality(Tokenizer.from_pretrained(), held_out)
    print(
        f"\ntrained 8000-token uncased vocab on 6 books, {len(held_out)} held-out lines of 6 other books: "
        f"[UNK] {unk_rate:.3%} of tokens, {per_word:.3f} tokens per word "
        f"(bert-base-uncased: [UNK] {ref_unk:.3%}, {ref_per_word:.3f} tokens per word)"
    )
    assert unk_rate < 0.005
    assert 1.0 < per_word < 1.25


@pytest.mark.data
@pytest.mark.oracle
@pytest.mark.slow
def test_cased_parity_with_trained_vocab(books, held_out, shared_data, tmp_path, transformers_mod):
    tokens = train_vocab_from_files(books[TRAIN_BOOKS], VocabTrainingConfig(vocab_size=6000, lowercase=False))
    ours = Tokenizer(tokens, lowercase=False)
    assert ours.tokenize("The") == ["The"]  # capitals kept: a cased vocabulary
    ours.save_pretrained(tmp_path)
    fast = transformers_mod.BertTokenizerFast.from_pretrained(str(tmp_path))
    assert len(fast) == len(tokens)
    rust = fast.backend_tokenizer
    rust.no_truncation()
    rust.no_padding()
    squad = json.loads((shared_data / "squad_v1.1" / "dev-v1.1.json").read_text(encoding="utf-8"))["data"]
    texts = held_out + [p["context"] for a in squad for p in a["paragraphs"]]
    mine = ours.encode_batch(texts, padding=False, return_tensors=None, truncation=False).encodings
    theirs = rust.encode_batch(texts)
    differ = [t for t, o, r in zip(texts, mine, theirs) if (o.input_ids, o.offsets, o.word_ids) != (r.ids, r.offsets, r.word_ids)]
    print(f"\ncased parity: {len(texts)} texts ({len(held_out)} Gutenberg lines + 2067 SQuAD contexts), {len(differ)} differ")
    assert not differ, differ[:3]
    # cased really is cased: capitals survive, accents too
    assert any(t != t.lower() for e in mine[:200] for t in e.tokens if t not in SPECIAL_TOKENS)


def test_the_counting_bar_ends_at_its_total_on_gzip_and_crlf_files(tmp_path, monkeypatch):
    """The "counting words" bar totalled the files' sizes on disk and counted the decoded lines: a .gz corpus
    ran past 100% (decompressed bytes against the compressed size), and a CRLF file stopped short. It now ends
    at its total, and never passes it on the way."""
    import gzip

    import tqdm

    from bertkit.text.vocab_training import iter_lines

    seen = []

    class Bar(tqdm.tqdm):
        def update(self, n=1):
            super().update(n)
            seen.append((self.n, self.total))

    monkeypatch.setattr(tqdm, "tqdm", Bar)
    text = "".join(f"line {i} of some text, repeated\n" for i in range(3000))
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(text.encode()))
    (tmp_path / "b.txt").write_bytes(text.replace("\n", "\r\n").encode())
    files = [tmp_path / "a.txt.gz", tmp_path / "b.txt"]
    assert sum(1 for _ in iter_lines(files, progress=True)) == 6000
    assert all(n <= total for n, total in seen) and seen[-1][0] == seen[-1][1]


@pytest.mark.parametrize("where", ["own", "shared"])
def test_vocab_train_writes_vocab_and_settings_as_one_pair(tmp_path, capsys, monkeypatch, where):
    """vocab.txt and tokenizer_config.json (its casing) were two writes: a kill between them left the new vocab.txt
    beside the last run's tokenizer_config.json (a --cased vocabulary read lower-cased) or, the first time, beside
    none. Each run below dies between its two writes (the second write raises, as a kill or a full disk stops
    it); what is left must be a pair written together: both old, both new, or (in a folder holding other files,
    which cannot be swapped whole) no vocab.txt at all, which every reader refuses, never a mixed pair."""
    from bertkit.cli import main
    import bertkit.data.atomic as atomic

    corpus = tmp_path / "a.txt"
    corpus.write_text("The Cat sat on the Mat.\nThe Dog sat on the Log.\n" * 20)
    out = tmp_path / "tok"
    if where == "shared":  # the folder holds the user's own file: it stays, whatever happens
        out.mkdir()
        (out / "notes.md").write_text("mine")

    def pair():
        vocab, settings = out / "vocab.txt", out / "tokenizer_config.json"
        return (vocab.read_text().split() if vocab.exists() else None,
                json.loads(settings.read_text())["do_lower_case"] if settings.exists() else None)

    def train(*flags):
        return main(["vocab", "train", str(corpus), "-o", str(out), "--vocab-size", "40", "--overwrite", *flags])

    real = atomic.write_through
    calls = []

    def dies_at_the_second_write(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device", str(path))
        return real(path, *args, **kwargs)

    assert train("--cased") == 0
    old = pair()
    assert old[0] is not None and old[1] is False
    monkeypatch.setattr(atomic, "write_through", dies_at_the_second_write)
    assert train() == 2  # uncased this time: a mixed pair would read the cased tokens lower-cased
    left = pair()
    assert left == old or (where == "shared" and left[0] is None), left
    monkeypatch.setattr(atomic, "write_through", real)
    assert train() == 0 and pair()[1] is True and Tokenizer.from_pretrained(out).lowercase
    if where == "shared":
        assert (out / "notes.md").read_text() == "mine"
    capsys.readouterr()
