"""Retrieval: what embedding training, evaluation, mining and the search index share.

(The BEIR folder layout is read by `bertkit.data.beir`; nDCG, MRR, MAP and Recall as trec_eval
computes them are `bertkit.metrics.retrieval`.)

- `config`: the settings of the retrieval commands (typed dataclasses);
- `exact`: exact cosine top-k in blocks of bounded memory (memory-mapped vectors too);
- `encoding`: embedding queries and passages as the model was trained to (its layout);
- `bm25`: the lexical baseline (the optional bm25s package);
- `evaluation`: retrieval and STS figures of a model;
- `mining`: hard negatives for contrastive training;
- `passages`: documents cut into token windows that keep their character spans, and their passages.jsonl lines;
- `index`: the index folder (memory-mapped vectors, the model's fingerprint, a resumable build);
- `index_check`: an index folder checked on open (counts, shapes, whole files), one line naming the fix;
- `extend`: a finished index given what is made from its own files (an HNSW graph, a lexical part);
- `lexical`: the BM25 part of an index (stemmed, over the same passages);
- `documents`: documents ranked by their best passage (MaxP);
- `search`: exact document top-k by best passage, dense, lexical or hybrid;
- `fusion`, `tuning`: fusing the dense and lexical runs (rrf, dbsf, minmax), and choosing how on a judged split;
- `compact`: int8 and binary codes of the vectors, searched with rescoring;
- `codes_file`: the codes on disk (codes.safetensors) and the rows kept to rescore with;
- `ann`: FAISS HNSW beside the exact vectors, with its measured recall;
- `qdrant`: export to, and search from, a Qdrant collection.

The cross-encoder that reranks search results is a fine-tuned model: `bertkit.tasks.rerank`.
"""
