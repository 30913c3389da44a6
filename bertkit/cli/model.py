"""Model commands: `bertkit model info` (shape, parameters, what loads into a head)."""

import json


HEAD_CHOICES = ["BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForNextSentencePrediction",
                "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering",
                "BertForMultipleChoice"]


def add_model(sub):
    p = sub.add_parser("model", help="inspect BERT checkpoints (shape, parameters, what loads)")
    msub = p.add_subparsers(dest="model_command", metavar="COMMAND", required=True)
    i = msub.add_parser(
        "info",
        help="show a checkpoint's config, parameter count and how it loads into a model class",
        description="Read a Hugging Face BERT directory (default: the embedded model), load it into "
        "CLASS without strictness and report missing / unused / unexpected weights.",
    )
    i.add_argument("path", nargs="?", help="model directory (default: the embedded all-MiniLM-L6-v2)")
    i.add_argument("--class", dest="cls", default="BertModel", choices=HEAD_CHOICES, help="model class to load into")
    i.add_argument("--json", action="store_true", help="print the config and report as JSON")
    i.set_defaults(handler=run_model_info)


def run_model_info(args):
    import warnings

    import bertkit

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the report below says it all
        model = getattr(bertkit, args.cls).from_pretrained(args.path, strict=False)
    report = model.load_report
    if args.json:
        print(json.dumps({"config": model.config.to_dict(), "parameters": model.num_parameters(),
                          "source": report.source, "missing": report.missing, "unused": report.unused,
                          "unexpected": report.unexpected, "mismatched": report.mismatched}))
        return
    c = model.config
    print(f"{report.source}")
    print(f"{args.cls}: {c.num_hidden_layers} layers, hidden {c.hidden_size}, {c.num_attention_heads} heads, "
          f"intermediate {c.intermediate_size}, vocab {c.vocab_size}, max positions {c.max_position_embeddings}")
    print(f"parameters: {model.num_parameters():,}")
    print(f"weights: {report.describe()}")
