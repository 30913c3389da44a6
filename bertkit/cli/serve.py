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
        "all-MiniLM-L6-v2) on HTTP with dynamic batching: requests are queued (bounded), packed by token "
        "budget and answered each with its own rows. Endpoints: POST /v1/embeddings /embed /predict /rerank "
        "/tokenize, /search with --index, GET /health /info /metrics. SIGTERM answers every accepted request, then exits 0.",
        epilog="examples:\n  bertkit serve\n"
        "  curl -s localhost:8080/embed -H 'Content-Type: application/json' -d '{\"inputs\": \"Hello!\"}'\n"
        "  BERTKIT_API_KEY=s3cret bertkit serve runs/sst2 --port 9000 --max-batch-tokens 8192\n"
        "  bertkit serve --api-key-file /run/secrets/bertkit_key --max-client-batch-size 64\n"
        "  bertkit serve --index scifact.index --rerank runs/cross-encoder",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(p, ServeConfig)
    p.set_defaults(handler=run_serve)


def run_serve(args):
    # BERTKIT_ONEDNN, read by the command line (`bertkit.cli.main`): the server decides its settings from
    # it once its threads are set
    server.serve(from_args(args, ServeConfig).with_api_key(dict(os.environ)).validate(), onednn=args.onednn)
