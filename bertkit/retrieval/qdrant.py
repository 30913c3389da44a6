"""An index in Qdrant: for a corpus that one machine cannot serve, on an engine that shards it.

`export` writes an index's vectors into a Qdrant collection (cosine distance),
one point per passage: the point id is the passage's row, the payload its
record (`id`, `doc_id`, `title`, `start`, `end`, `text`) and its document
number; the collection's metadata keeps the index's index.json, so a query is
embedded by the model that made the vectors and another model is refused, as
for the index itself (`bertkit.retrieval.index.check_model`).

`search` asks Qdrant for the `k x max_passages_per_document` nearest passages
and keeps each document's best, as `bertkit.retrieval.search` does: the same
answers as the exact search when Qdrant's search is exact, which its local mode
(a folder on disk, in-process, what the tests use) is; a server (`http://...`)
searches its own HNSW graph, approximate.

qdrant-client is optional (`pip install 'bertkit[search]'`) and imported only here.
"""

from __future__ import annotations

from tqdm import tqdm

from bertkit.errors import BertkitError
from bertkit.retrieval.index import Index
from bertkit.retrieval.search import Hit, check_k, embed_queries, first_per_document, query_encoder

METADATA_KEY = "bertkit_index"  # the collection's metadata entry holding index.json


def _qdrant():
    try:
        import qdrant_client
        from qdrant_client import models
    except ImportError:
        raise BertkitError("--qdrant needs qdrant-client: pip install 'bertkit[search]'") from None
    return qdrant_client, models


def connect(location: str):
    """A client: a URL (http:// or https://) reaches a server, anything else is a local-mode folder."""
    qdrant_client, _ = _qdrant()
    if location.startswith(("http://", "https://")):
        return qdrant_client.QdrantClient(url=location)
    return qdrant_client.QdrantClient(path=location)


def export(index: Index, location: str, collection: str, *, batch_size: int = 1024, progress: bool = True) -> int:
    """Write every passage of `index` into a new collection; returns the number of points."""
    _, models = _qdrant()
    client = connect(location)
    try:
        if client.collection_exists(collection):
            raise BertkitError(f"collection {collection!r} already exists in {location}: choose another name, or "
                               "delete it first")
        client.create_collection(collection, vectors_config=models.VectorParams(
            size=int(index.info["dim"]), distance=models.Distance.COSINE), metadata={METADATA_KEY: index.info})
        n = len(index)
        with tqdm(total=n, disable=not progress, desc="exporting", unit="passage") as bar:
            for start in range(0, n, batch_size):
                rows = range(start, min(start + batch_size, n))
                payloads = [{**p, "document": int(index.document[r])} for r, p in zip(rows, index.passages(rows))]
                client.upsert(collection, points=models.Batch(
                    ids=list(rows), vectors=index.vectors[start : rows.stop].tolist(), payloads=payloads))
                bar.update(len(rows))
        return n
    finally:
        client.close()


def search(location: str, collection: str, queries: list[str], k: int = 10, *, model=None, device=None,
           dtype=None, batch_size: int = 32) -> list[list[Hit]]:
    """For each query, the k best documents of the collection with their best passages, best first."""
    check_k(k)
    client = connect(location)
    try:
        info = _collection_info(client, location, collection)
        loaded = query_encoder(info, model, device, dtype)
        vectors = embed_queries(info, loaded, list(queries), batch_size)
        return _answers(client, collection, info, vectors, k)
    finally:
        client.close()


def search_vectors(location: str, collection: str, query_vectors, k: int = 10) -> list[list[Hit]]:
    """`search` for queries already embedded (unit vectors [Q, D], by the model that made the
    collection: nothing here can check that), as `bertkit.retrieval.search.search_vectors`."""
    check_k(k)
    client = connect(location)
    try:
        return _answers(client, collection, _collection_info(client, location, collection), query_vectors, k)
    finally:
        client.close()


def _collection_info(client, location: str, collection: str) -> dict:
    """The index.json that `export` kept in the collection's metadata."""
    if not client.collection_exists(collection):
        raise BertkitError(f"no collection {collection!r} in {location}: export one with bertkit index export "
                           f"INDEX --qdrant {location} --collection {collection}")
    info = (client.get_collection(collection).config.metadata or {}).get(METADATA_KEY)
    if info is None:
        raise BertkitError(f"collection {collection!r} was not written by bertkit index export: it does not say "
                           "which model made its vectors")
    return info


def _answers(client, collection: str, info: dict, vectors, k: int) -> list[list[Hit]]:
    depth = k * int(info["max_passages_per_document"])
    answers = []
    for vector in vectors:
        points = client.query_points(collection, query=[float(x) for x in vector], limit=depth,
                                     with_payload=True).points
        kept = first_per_document(points, lambda point: point.payload["document"], k)
        answers.append([Hit(p.payload["id"], p.payload["doc_id"], float(p.score), p.payload["text"],
                            p.payload["title"], p.payload["start"], p.payload["end"]) for p in kept])
    return answers
