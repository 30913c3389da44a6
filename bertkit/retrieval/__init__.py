"""Retrieval: what embedding training, evaluation, mining and the search index share.

- `beir`: the BEIR folder layout (corpus, queries, qrels) and training pairs from it;
- `metrics`: nDCG, MRR, MAP, Recall as trec_eval computes them;
- `exact`: exact cosine top-k in blocks of bounded memory (memory-mapped vectors too);
- `encoding`: embedding queries and passages as the model was trained to (its layout);
- `bm25`: the lexical baseline (the optional `bm25s` package);
- `evaluation`: retrieval and STS figures of a model;
- `mining`: hard negatives for contrastive training.
"""
