"""BM25, the lexical baseline every retrieval table carries, through the `bm25s` package.

BM25 (Robertson & Zaragoza 2009) scores a document d for a query q as

    sum over query terms t of  idf(t) * tf(t, d) * (k1 + 1) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))

We do not write it again: `bm25s` (Lu 2024, xhluca/bm25s) is a maintained,
fast implementation that reproduces Lucene's (BEIR's Elasticsearch baseline)
scores. Its settings here, stated because they move the figures:

- method "lucene" (Lucene's idf, log(1 + (N - df + 0.5) / (df + 0.5))), k1 1.5, b 0.75;
- tokens: lower-cased runs of two or more word characters (bm25s' default
  pattern), English stop words removed, **no stemming** by default (the
  baseline `evaluate retrieval --bm25` prints); `stemmer="english"` stems with
  PyStemmer, MTEB's bm25s setting and the lexical part of an index's
  (`bertkit.retrieval.lexical`): 0.686 nDCG@10 on SciFact test against 0.662.

The package is an optional extra: `pip install 'bertkit[search]'`.
"""

from __future__ import annotations

import numpy as np

from bertkit.errors import BertkitError, MissingPackage

K1, B, STOPWORDS = 1.5, 0.75, "en"


def require_bm25s():
    """The bm25s module, or the MissingPackage error that names the extra to install."""
    try:
        import bm25s
    except ImportError:
        raise MissingPackage("BM25 needs the bm25s package: pip install 'bertkit[search]'") from None
    return bm25s


def stem_function(name: str | None):
    """PyStemmer's stemmer `name` as a list -> list function, or None for no stemming."""
    if name is None:
        return None
    try:
        import Stemmer
    except ImportError:
        raise MissingPackage("stemming needs the PyStemmer package: pip install 'bertkit[search]'") from None
    return Stemmer.Stemmer(name).stemWords


def bm25_run(documents: dict[str, str], queries: dict[str, str], k: int = 100, *, k1: float = K1, b: float = B,
             stopwords=STOPWORDS, stemmer: str | None = None, progress: bool = False) -> dict[str, dict[str, float]]:
    """query id -> {doc id: BM25 score} for each query's top `k` documents (a run for `metrics`); documents
    that share no token with a query are left out of its run."""
    bm25s = require_bm25s()
    if not documents:
        raise BertkitError("no documents to index for BM25")
    doc_ids = list(documents)
    stem = stem_function(stemmer)
    corpus_tokens = bm25s.tokenize(list(documents.values()), stopwords=stopwords, stemmer=stem,
                                   show_progress=progress)
    retriever = bm25s.BM25(k1=k1, b=b, method="lucene")
    retriever.index(corpus_tokens, show_progress=progress)
    query_ids = list(queries)
    # the queries' words as strings, looked up in the corpus vocabulary by retrieve()
    query_tokens = bm25s.tokenize([queries[q] for q in query_ids], stopwords=stopwords, stemmer=stem,
                                  return_ids=False, show_progress=False)
    k = min(k, len(doc_ids))
    rows, scores = retriever.retrieve(query_tokens, k=k, show_progress=progress)
    rows, scores = np.asarray(rows), np.asarray(scores, dtype=np.float64)
    return {q: {doc_ids[r]: float(s) for r, s in zip(rows[i], scores[i]) if s > 0} for i, q in enumerate(query_ids)}
