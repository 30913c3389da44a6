"""Retrieval and STS evaluation: sentence-transformers' evaluators on the same files (the default
model on small slices), and the whole pipeline against numpy + pytrec_eval (a tiny model)."""

import importlib.util
import json

import sys

import numpy as np
import pytest

from conftest import need
from test_retrieval_beir import scifact_slice
from bertkit.errors import BertkitError
from bertkit.data.beir import document_text, load_beir
from bertkit.retrieval.bm25 import bm25_run
from bertkit.retrieval.evaluation import evaluate_retrieval, evaluate_sts, read_sts
from bertkit.metrics.retrieval import DEFAULT_MEASURES, evaluate_run


def oracle(module: str):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        need(False, f"{module} (an oracle, dev extra) is not installed")


@pytest.fixture(scope="module")
def sentence_transformers():
    return oracle("sentence_transformers")


@pytest.fixture(scope="module")
def st_model(sentence_transformers, default_model_dir):
    return sentence_transformers.SentenceTransformer(str(default_model_dir), device="cpu")


@pytest.fixture(scope="module")
def small_scifact(shared_data, tmp_path_factory):
    return scifact_slice(shared_data, tmp_path_factory.mktemp("scifact"), n_queries=8, n_extra=15)


def test_default_model_equals_sentence_transformers_evaluator(small_scifact, st_model):
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    data = load_beir(small_scifact, "test")
    relevant = {q: {d for d, s in docs.items() if s > 0} for q, docs in data.qrels.items()}
    corpus = {d: document_text(doc) for d, doc in data.corpus.items()}
    evaluator = InformationRetrievalEvaluator(data.queries, corpus, relevant, mrr_at_k=[10], ndcg_at_k=[10],
                                              map_at_k=[100], precision_recall_at_k=[10, 100], write_csv=False)
    theirs = evaluator(st_model)
    ours = evaluate_retrieval(None, small_scifact, "test", progress=False)
    assert st_model.max_seq_length == ours["max_length"] == 256
    assert ours["precision"] == "float32" and ours["split"] == "test" and ours["pooling"] == "mean"
    for measure in DEFAULT_MEASURES:
        assert ours[measure] == pytest.approx(theirs[f"cosine_{measure}"], abs=1e-6), measure


def test_leading_dimensions_equal_sentence_transformers_truncate_dim(small_scifact, st_model):
    """--dimensions: the vectors cut to their leading d and renormalised, scored as sentence-transformers'
    evaluator scores them with truncate_dim=d; the whole width gives the main figures again."""
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    data = load_beir(small_scifact, "test")
    relevant = {q: {d for d, s in docs.items() if s > 0} for q, docs in data.qrels.items()}
    corpus = {d: document_text(doc) for d, doc in data.corpus.items()}
    ours = evaluate_retrieval(None, small_scifact, "test", progress=False, dimensions=[384, 32, 64])
    assert list(ours["dimensions"]) == ["32", "64", "384"]
    for measure in DEFAULT_MEASURES:
        assert ours["dimensions"]["384"][measure] == pytest.approx(ours[measure], abs=1e-9)
    for d in (32, 64):
        theirs = InformationRetrievalEvaluator(data.queries, corpus, relevant, mrr_at_k=[10], ndcg_at_k=[10],
                                               map_at_k=[100], precision_recall_at_k=[10, 100], write_csv=False,
                                               truncate_dim=d)(st_model)
        for measure in DEFAULT_MEASURES:
            assert ours["dimensions"][str(d)][measure] == pytest.approx(theirs[f"cosine_{measure}"], abs=1e-6)
    assert ours["dimensions"]["32"]["ndcg@10"] != ours["ndcg@10"]  # the cut is really applied
    with pytest.raises(BertkitError, match="more than the model's 384"):
        evaluate_retrieval(None, small_scifact, "test", progress=False, dimensions=[512])


def test_default_model_sts_equals_sentence_transformers(shared_data, st_model):
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

    pairs = read_sts(shared_data / "stsb" / "dev.tsv")[:24]
    theirs = EmbeddingSimilarityEvaluator([a for a, _, _ in pairs], [b for _, b, _ in pairs],
                                          [s / 5 for _, _, s in pairs], write_csv=False)(st_model)
    ours = evaluate_sts(None, pairs)
    assert ours["spearman"] == pytest.approx(theirs["spearman_cosine"], abs=1e-6)
    assert ours["pearson"] == pytest.approx(theirs["pearson_cosine"], abs=1e-6)
    assert ours["pairs"] == 24 and ours["max_length"] == 256 and ours["precision"] == "float32"


def test_pipeline_equals_numpy_and_pytrec_eval(small_scifact, tiny_dir):
    """Our top-k and metrics against a brute-force numpy ranking scored by pytrec_eval, on the
    tiny model's vectors (made by bertkit.embed with the same settings)."""
    import bertkit

    pytrec_eval = oracle("pytrec_eval")
    data = load_beir(small_scifact, "test")
    ours = evaluate_retrieval(str(tiny_dir), small_scifact, "test", progress=False)
    assert ours["max_length"] == 64  # no layout: the model's positions
    doc_ids = list(data.corpus)
    docs = bertkit.embed([document_text(data.corpus[d]) for d in doc_ids], str(tiny_dir), pooling="mean",
                         normalize=True, truncate=True, max_length=64)
    queries = bertkit.embed(list(data.queries.values()), str(tiny_dir), pooling="mean", normalize=True,
                            truncate=True, max_length=64)
    cosine = queries.astype(np.float64) @ docs.astype(np.float64).T
    run = {q: {doc_ids[j]: float(cosine[i, j]) for j in np.argsort(-cosine[i])[:100]}
           for i, q in enumerate(data.queries)}
    trec = pytrec_eval.RelevanceEvaluator(data.qrels, {"ndcg_cut.10", "map_cut.100", "recall.10,100"}).evaluate(run)
    mean = {name: np.mean([t[name] for t in trec.values()]) for name in next(iter(trec.values()))}
    assert ours["ndcg@10"] == pytest.approx(mean["ndcg_cut_10"], abs=1e-6)
    assert ours["map@100"] == pytest.approx(mean["map_cut_100"], abs=1e-6)
    assert ours["recall@10"] == pytest.approx(mean["recall_10"], abs=1e-6)
    assert ours["recall@100"] == pytest.approx(mean["recall_100"], abs=1e-6)


def test_documents_and_queries_read_cut_are_counted_and_said(small_scifact, tiny_dir, transformers_mod, tmp_path):
    """Without --index the corpus is embedded cut at the model's max length (as MTEB embeds it), and a 700-token
    abstract was ranked by its first 256 tokens without a word: one warning now counts the documents (and queries)
    read cut, and the result records them. Reference: transformers' count of each text, uncut, against 24."""
    import shutil

    folder = tmp_path / "with_short"
    shutil.copytree(small_scifact, folder)
    with open(folder / "corpus.jsonl", "a", encoding="utf-8") as f:  # beside abstracts of 100 tokens and more
        f.write('{"_id": "short", "title": "A note", "text": "Vitamin D and bones."}\n')
    fast = transformers_mod.BertTokenizerFast.from_pretrained(str(tiny_dir))
    data = load_beir(folder, "test")
    documents = sum(len(fast(document_text(doc))["input_ids"]) > 24 for doc in data.corpus.values())
    queries = sum(len(fast(q)["input_ids"]) > 24 for q in data.queries.values())
    assert 0 < documents < len(data.corpus) and 0 < queries < len(data.queries)
    with pytest.warns(UserWarning, match=rf"^{documents} of {len(data.corpus)} documents and {queries} of "
                      rf"{len(data.queries)} queries are longer than the 24 tokens the model reads") as said:
        result = evaluate_retrieval(str(tiny_dir), folder, "test", max_length=24, progress=False)
    assert (result["documents_cut"], result["queries_cut"]) == (documents, queries)
    assert len([w for w in said if "longer than" in str(w.message)]) == 1  # one line, not one per text or batch


def test_sts_sentences_read_cut_are_counted_and_said(tiny_dir, transformers_mod):
    """evaluate sts embedded a sentence past the max length cut, unsaid: one warning counts the distinct sentences
    read cut, and the result records them. Reference: transformers' count of each sentence, uncut, against 16."""
    fast = transformers_mod.BertTokenizerFast.from_pretrained(str(tiny_dir))
    pairs = [("a cat sat on the mat", "the dog ran far " * 5, 3.0), ("a man plays", "a man plays a guitar", 4.0),
             ("the dog ran far " * 5, "a woman is slicing an onion into the pan " * 3, 1.0)]
    sentences = list(dict.fromkeys(s for a, b, _ in pairs for s in (a, b)))
    cut = sum(len(fast(s)["input_ids"]) > 16 for s in sentences)
    assert 0 < cut < len(sentences)
    with pytest.warns(UserWarning, match=rf"^{cut} of {len(sentences)} sentences are longer than the 16 tokens"):
        result = evaluate_sts(str(tiny_dir), pairs, max_length=16)
    assert result["sentences_cut"] == cut


def test_a_loaded_pair_and_the_bm25_baseline(small_scifact, tiny_dir):
    from bertkit.model.modeling import BertModel
    from bertkit.text.tokenizer import Tokenizer

    need(importlib.util.find_spec("bm25s") is not None, "bm25s (the search extra) is not installed")
    model = BertModel.from_pretrained(tiny_dir).train()
    result = evaluate_retrieval((model, Tokenizer.from_pretrained(tiny_dir)), small_scifact, "test",
                                max_length=32, bm25=True, progress=False)
    assert model.training  # evaluation leaves a model being trained in training mode
    assert result["model"] == "(model in memory)" and result["max_length"] == 32
    data = load_beir(small_scifact, "test")
    run = bm25_run({d: document_text(doc) for d, doc in data.corpus.items()}, data.queries)
    assert result["bm25"]["ndcg@10"] == pytest.approx(evaluate_run(data.qrels, run)["ndcg@10"])
    assert result["bm25"]["ndcg@10"] > 0.5  # the slice's claims share words with their abstracts


def test_bm25_ranks_the_document_with_the_rare_words_first():
    need(importlib.util.find_spec("bm25s") is not None, "bm25s (the search extra) is not installed")
    docs = {"a": "the cat sat on the mat", "b": "photosynthesis in chloroplasts of plant cells",
            "c": "the dog sat on the log"}
    run = bm25_run(docs, {"q": "where does photosynthesis happen in plants"}, k=3)
    assert max(run["q"], key=run["q"].get) == "b"


def test_bm25_without_the_package_names_the_extra(monkeypatch, small_scifact):
    monkeypatch.setitem(sys.modules, "bm25s", None)
    with pytest.raises(BertkitError, match=r"pip install 'bertkit\[search\]'"):
        bm25_run({"a": "x"}, {"q": "x"})
    with pytest.raises(BertkitError, match=r"bertkit\[search\]"):  # said before any model is loaded
        evaluate_retrieval("no/such/model", small_scifact, "test", bm25=True)


@pytest.mark.parametrize("mode", ["hybrid", "all"])
def test_a_stemmed_run_without_pystemmer_names_the_extra_before_any_model_loads(monkeypatch, small_scifact, mode):
    """--mode hybrid and all stem the words of their BM25 run (as an index's lexical part): with bm25s but not
    PyStemmer, the check asked for bm25s alone, so the corpus was embedded before the missing stemmer was said."""
    need(importlib.util.find_spec("bm25s") is not None, "bm25s (the search extra) is not installed")
    monkeypatch.setitem(sys.modules, "Stemmer", None)
    with pytest.raises(BertkitError, match=r"PyStemmer package: pip install 'bertkit\[search\]'"):
        evaluate_retrieval("no/such/model", small_scifact, "test", mode=mode)  # a model would be refused after it
    with pytest.raises(BertkitError, match="no/such/model"):  # --bm25's baseline stems nothing: it goes on
        evaluate_retrieval("no/such/model", small_scifact, "test", bm25=True)


def test_sts_reads_the_tables_the_trainer_reads(tmp_path):
    """`bertkit finetune embed --dev` takes scored pairs as TSV, CSV or JSONL (`bertkit.data.tables.read_rows`);
    `evaluate sts` took TSV alone (a CSV was "no sentence1, sentence2, score column"). The same pairs in each
    format read the same; a quoted CSV cell keeps its comma; a JSON score may be a number."""
    pairs = [("A man, a plan.", "A canal.", 4.5), ("Cats sleep.", "Dogs bark.", 0.25)]
    (tmp_path / "s.tsv").write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in pairs),
                                    encoding="utf-8")
    (tmp_path / "s.csv").write_text('score,sentence1,sentence2\n4.5,"A man, a plan.",A canal.\n'
                                    "0.25,Cats sleep.,Dogs bark.\n", encoding="utf-8")
    (tmp_path / "s.jsonl").write_text("".join(json.dumps({"sentence1": a, "sentence2": b, "score": s}) + "\n"
                                              for a, b, s in pairs), encoding="utf-8")
    for name in ("s.tsv", "s.csv", "s.jsonl"):
        assert read_sts(tmp_path / name) == pairs, name
    (tmp_path / "short.tsv").write_text("sentence1\tsentence2\tscore\na\tb\t1\nc\t2\ne\tf\t3\n", encoding="utf-8")
    with pytest.raises(BertkitError, match="short.tsv: 1 rows with 2 fields instead of 3"):  # never a silent skip
        read_sts(tmp_path / "short.tsv")


def test_sts_file_errors(tmp_path):
    path = tmp_path / "sts.tsv"
    path.write_text("sentence1\tsentence2\tlabel\na\tb\t1\n", encoding="utf-8")
    with pytest.raises(BertkitError, match="no score column"):
        read_sts(path)
    path.write_text("sentence1\tsentence2\tscore\na\tb\t1\n", encoding="utf-8")
    with pytest.raises(BertkitError, match="at least 2"):
        read_sts(path)
    path.write_text("sentence1\tsentence2\tscore\na\tb\tnan\nc\td\t2\ne\tf\t3\n", encoding="utf-8")
    with pytest.raises(BertkitError, match="line 2: score 'nan' is not a finite number"):  # was a pearson of nan
        read_sts(path)
    path.write_text("", encoding="utf-8")
    with pytest.raises(BertkitError, match="empty"):
        read_sts(path)
    path.write_text("sentence1\tsentence2\tscore\na\tb\t3\nc\td\t3.0\ne\tf\t3\n", encoding="utf-8")
    with pytest.raises(BertkitError, match="sts.tsv: every gold score is 3: a correlation needs at least two"):
        evaluate_sts(None, path)  # was spearman nan, pearson nan (scipy's too), and NaN in the --output JSON
    with pytest.raises(BertkitError, match="^every gold score is 1"):
        evaluate_sts(None, [("a", "b", 1), ("c", "d", 1.0)])
    with pytest.raises(BertkitError, match="pair 1: score 'high' is not a number"):  # was a ValueError
        evaluate_sts(None, [("a", "b", 1), ("c", "d", "high")])
    path.write_text("sentence1\tsentence2\tscore\na\tb\t3\nc\t \t2\n", encoding="utf-8")
    with pytest.raises(BertkitError, match="sts.tsv line 3: sentence2 is empty"):  # was unnamed, from the embedder
        read_sts(path)


def test_sts_pairs_from_any_iterable_score_as_the_list_and_a_short_row_is_named(tiny_dir):
    """evaluate_sts(model, zip(first, second, scores)), a notebook's way to hand over three columns, was a
    TypeError from the file reader ('expected str, bytes or os.PathLike object, not zip'); a row without its
    score a ValueError from unpacking, a None text a TypeError from the tokenizer."""
    pairs = [("a man eats", "a man is eating", 4.5), ("a dog runs", "the market fell", 0.2),
             ("kids play", "children are playing", 4.0), ("it rains", "the sun shines", 1.0)]
    want = evaluate_sts(str(tiny_dir), pairs)
    for given in (zip(*zip(*pairs)), (p for p in pairs), iter(pairs)):
        got = evaluate_sts(str(tiny_dir), given)
        assert (got["spearman"], got["pearson"], got["pairs"], got["data"]) == (
            want["spearman"], want["pearson"], 4, None)
    with pytest.raises(BertkitError, match=r"pair 1 has 2 items: each pair is \(sentence1, sentence2, score\)"):
        evaluate_sts(str(tiny_dir), [pairs[0], pairs[1][:2]])
    with pytest.raises(BertkitError, match="pair 1: sentence2 is NoneType: every pair needs two texts"):
        evaluate_sts(str(tiny_dir), [pairs[0], ("a", None, 2.0)])  # was a TypeError from the tokenizer
    with pytest.raises(BertkitError, match="pair 0: sentence1 is empty"):
        evaluate_sts(str(tiny_dir), [(" ", "b", 1.0), pairs[1]])
    with pytest.raises(BertkitError, match="pairs_or_path must be a file or .* got int"):
        evaluate_sts(str(tiny_dir), 3)


def test_an_sts_sentence_without_tokens_is_named_by_its_line(tiny_dir, tmp_path):
    # "text '\u200b' yields no tokens" and nothing more: an invisible text in a file of thousands of pairs;
    # it is named by its line and column (a list's pair by its place), as an empty one is
    path = tmp_path / "sts.tsv"
    path.write_text("sentence1\tsentence2\tscore\na cat\ta dog\t3\nsome text\t\u200b\t1\n", encoding="utf-8")
    with pytest.raises(BertkitError, match=r"sts.tsv line 3 sentence2: text '\\u200b' yields no tokens"):
        evaluate_sts(str(tiny_dir), path)
    with pytest.raises(BertkitError, match=r"^pair 1 sentence1: text '\\u200b' yields no tokens"):
        evaluate_sts(str(tiny_dir), [("a cat", "a dog", 3), ("\u200b", "a cat", 1)])


def test_a_document_without_any_token_is_left_out_as_the_index_leaves_it_out(small_scifact, tiny_dir, tmp_path):
    """A corpus line with neither title nor text stopped the whole evaluation with "cannot embed an empty
    text" (naming no document); it is left out of the ranking instead, as `bertkit index` leaves it out of
    an index: the figures equal those of the corpus without it. A text of characters BERT drops ("\u200b")
    still stopped it ("_id 'dropped': text yields no tokens") while `bertkit index` of the same corpus left
    it out and counted it, and `evaluate --index` scored that corpus: the two now agree, document for
    document (the index's count of the same corpus is the evaluation's)."""
    import shutil

    from bertkit.retrieval.passages import cut_all, read_documents
    from bertkit.text.tokenizer import Tokenizer

    folder = tmp_path / "with_empty"
    shutil.copytree(small_scifact, folder)
    with open(folder / "corpus.jsonl", "a", encoding="utf-8") as f:
        f.write('{"_id": "empty", "title": "", "text": "  "}\n')
        f.write('{"_id": "dropped", "title": "\\u0301", "text": "\\u200b\\u200b \\u0000"}\n')
    kept = evaluate_retrieval(str(tiny_dir), small_scifact, "test", progress=False)
    ours = evaluate_retrieval(str(tiny_dir), folder, "test", progress=False)
    assert ours["documents_without_tokens"] == 2 and kept["documents_without_tokens"] == 0
    assert ours["documents"] == kept["documents"] + 2
    for measure in DEFAULT_MEASURES:
        assert ours[measure] == kept[measure], measure
    _, _, left_out = cut_all(read_documents(folder / "corpus.jsonl"), Tokenizer.from_pretrained(tiny_dir), 32, 6)
    assert left_out == ours["documents_without_tokens"]
