"""`bertkit serve`: a model behind HTTP, with dynamic batching.

    settings.py  ServeConfig, the one definition of every server setting (and its CLI flag)
    runner.py    the model in a directory as batch-level calls: EmbeddingModel (embeddings), TaskModel (predict)
    batching.py  the bounded queue, the gatherer, the workers, and passes cut by token budget and padding
    scans.py     /search's scans of the index, gathered across requests
    app.py       the Starlette routes: OpenAI /v1/embeddings, TEI /embed and /tokenize, /predict, /rerank,
                 /search (with --index), /health, /info, /metrics
    requests.py  reading and answering requests: what every route shares below its handler
    limits.py    what one request may ask for (inputs, tokens, k, answer size, JSON depth), each named by its flag
    connections.py  deadlines for a request's headers and its answer; the connection limit
    metrics.py   Prometheus text-format counters, gauge and histograms
    server.py    start-up (kernel caches, threads, load, bind) and graceful shutdown with uvicorn

Needs the serve extra (Starlette, uvicorn, orjson); nothing here is imported by `import bertkit`.
"""
