"""The tokenizer's speed measures (bertkit.text.tokenizer_speed) change no output."""

import gc
import pickle

import pytest

from bertkit.text import tokenizer_speed
from bertkit.text.tokenizer import Tokenizer
from bertkit.text.tokenizer_speed import WordCache, gc_paused

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "hello", ",", "world"]


@pytest.fixture()
def tok():
    return Tokenizer(VOCAB)


def test_cache_keeps_one_piece_words_as_bare_ids_and_empties_at_its_limit(tok, monkeypatch):
    assert tok.tokenize("hello unaffable hello") == ["hello", "un", "##aff", "##able", "hello"]
    assert tok._cache["hello"] == 8  # one word, one piece, the whole run
    assert tok._cache["unaffable"] == ([5, 6, 7], [0, 2, 5], [2, 5, 9], [0, 0, 0], 1)
    monkeypatch.setattr(tokenizer_speed, "CACHE_LIMIT", 2)
    cache = WordCache()
    for run in ("hello", "world", "unaffable"):
        cache.add(run, tok._analyse)
    assert list(cache) == ["unaffable"]  # emptied when full, then the new run stored
    # a cold cache and a warm one give the same encoding
    fresh = Tokenizer(VOCAB)
    assert fresh.encode("Hello, unaffable world").to_dict() == tok.encode("Hello, unaffable world").to_dict()


def test_gc_paused_restores_the_collector():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # it was off before: it stays off
    finally:
        gc.enable()


def test_workers_and_pickling_change_nothing(tok):
    texts = ["hello , world unaffable"] * 40 + ["unaffable hello"] * 30
    one = tok.encode_batch(texts, num_workers=1, return_tensors=None)
    two = tok.encode_batch(texts, num_workers=2, return_tensors=None)
    assert [e.to_dict() for e in one.encodings] == [e.to_dict() for e in two.encodings]
    copy = pickle.loads(pickle.dumps(tok))  # DataLoader workers get a copy: no pool, an empty cache
    assert copy._workers is None and len(copy._cache) == 0
    assert copy.encode("hello unaffable").input_ids == tok.encode("hello unaffable").input_ids
    tok.close()
    assert tok._workers is None


def test_asked_workers_inside_a_daemonic_process_tokenize_in_it(tok, monkeypatch):
    """A DataLoader worker (a daemonic process) may not start children: num_workers=2 there was
    multiprocessing's "AssertionError: daemonic processes are not allowed to have children". The results
    are the same in one process, so it tokenizes there."""
    texts = ["hello , world unaffable"] * 20
    one = tok.encode_batch(texts, num_workers=1, return_tensors=None)
    monkeypatch.setattr(tokenizer_speed, "can_start_workers", lambda: False)
    two = tok.encode_batch(texts, num_workers=2, return_tensors=None)
    assert tok._workers is None  # no pool was started
    assert [e.to_dict() for e in one.encodings] == [e.to_dict() for e in two.encodings]
