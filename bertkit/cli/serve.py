"""`bertkit serve`: a model behind HTTP (see `bertkit.serve`); its options come from `ServeConfig`."""

import argparse
import os

from bertkit.options import add_options, from_args
from bertkit.serve import server
from bertkit.serve.settings import ServeConfig


def add_serve(sub):
    p = sub.add_parser(
        "serve",
        help="serve a model over HTTP: embeddings (OpenAI and TEI APIs), predictions, reranking",
        description="Serve MODEL_DIR (an encoder, or a `bertkit finetune` output; default: the embedded "
        "all-MiniLM-L6-v2, or beside --index the model that made it) on HTTP with dynamic batching: requests are queued (bounded), packed by token "
        "budget and answered each with its own rows. Endpoints: POST /v1/embeddings /embed /predict /rerank "
        "/tokenize, /search with --index, GET /health /info /metrics. SIGTERM answers every accepted request, then exits 0. "
        "Needs the serve extra: pip install 'bertkit[serve]' (and for an --index with a lexical part, [search]).",
        epilog="examples:\n  bertkit serve\n"
        "  curl -s localhost:8080/embed -H 'Content-Type: application/json' -d '{\"inputs\": \"Hello!\"}'\n"
        "  BERTKIT_API_KEY=s3cret bertkit serve runs/sst2 --port 9000 --max-batch-tokens 8192\n"
        "  bertkit serve --api-key-file /run/secrets/bertkit_key --max-client-batch-size 64\n"
        "  bertkit serve --index scifact.index --rerank runs/cross-encoder",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(p, ServeConfig)
    p.set_defaults(handler=run_serve)


KERNEL_CACHE_ENTRIES = 256
KERNEL_CACHES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_kernel_caches(environ=None) -> dict:
    """Keep oneDNN's per-shape kernel caches bounded in `environ` (default os.environ) where the user has
    not set them; returns what it set. Effective only before torch is first imported.

    oneDNN (under `bertkit.runtime.fast`'s dense layers) prepares (compiles) a kernel for each input
    shape and keeps it, with buffers laid out for it, in two caches (its primitive cache and
    PyTorch's ideep LRU cache, whose sizes the libraries read from these environment variables
    when they start). A server sees a new (rows x length) shape every few passes: unbounded, its
    memory keeps growing; bounded alone, nearly every pass pays for new kernels. So the caches
    hold 256 entries and the server's rows are padded to one of 40 sizes (`bertkit.serve.server.speed`):
    the kernels of every shape stay cached and memory stays flat (docs/serving.md has the measurements).
    A process setting of the `bertkit serve` command, made here at the command line's boundary (as
    `bertkit.cli.process_settings` makes every command's): the library writes no environment variable.
    """
    environ = os.environ if environ is None else environ
    made = {name: str(KERNEL_CACHE_ENTRIES) for name in KERNEL_CACHES if name not in environ}
    environ.update(made)
    return made


def run_serve(args):
    bound_kernel_caches()  # before the server imports torch
    # BERTKIT_ONEDNN, read by the command line (`bertkit.cli.main`): the server decides its settings from
    # it once its threads are set
    server.serve(from_args(args, ServeConfig).with_api_key(dict(os.environ)).validate(), onednn=args.onednn)
