"""Model commands: `bertkit model info` (shape, parameters, what loads into a head) and
`bertkit export onnx` (a model for deployment)."""

import argparse
import json
import warnings

import bertkit


HEAD_CHOICES = ["BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForNextSentencePrediction",
                "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering",
                "BertForMultipleChoice",
                # an ELECTRA folder loads into its ELECTRA form of a BERT class anyway; these name them directly
                "ElectraModel", "ElectraForPreTraining", "ElectraForMaskedLM", "ElectraForSequenceClassification",
                "ElectraForTokenClassification", "ElectraForQuestionAnswering"]


def add_model(sub):
    p = sub.add_parser("model", help="inspect BERT checkpoints (shape, parameters, what loads)")
    msub = p.add_subparsers(dest="model_command", metavar="COMMAND", required=True)
    i = msub.add_parser(
        "info",
        help="show a checkpoint's config, parameter count and how it loads into a model class",
        description="Read a Hugging Face BERT or ELECTRA directory (default: the embedded model), load it into "
        "CLASS (an ELECTRA directory: its ELECTRA form) without strictness and report missing / unused / "
        "unexpected weights; a static model (`bertkit distill static`): its table's size.",
    )
    i.add_argument("path", nargs="?", help="model directory (default: the embedded all-MiniLM-L6-v2)")
    i.add_argument("--class", dest="cls", choices=HEAD_CHOICES,
                   help="model class to load into (default: the one its config.json's architectures names, "
                   "BertModel when it names none or one not listed here)")
    i.add_argument("--json", action="store_true", help="print the config and report as JSON")
    i.set_defaults(handler=run_model_info)


def run_model_info(args):
    from bertkit.model.static import is_static
    from bertkit.runtime.loading import CLASSES, architecture, class_for, encoder_dir

    # no folder there is no static model either: encoder_dir names the missing folder
    if args.path and is_static(args.path):  # `bertkit distill static`'s output: a table, no layers
        return _static_info(args)
    where = args.path and encoder_dir(args.path)  # an older sentence-transformers folder: its 0_Transformer
    # by default the class the folder was saved as: BertModel alone reported a fine-tuned classifier's or an
    # MLM checkpoint's head as "unused" weights (and a BertForMaskedLM's absent pooler as "missing") and
    # counted the parameters without the head
    name = args.cls or architecture(encoder_dir(args.path))
    cls = class_for(where, CLASSES.get(name, CLASSES["BertModel"]))  # an ELECTRA run's: its form
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the report below says it all
        model = cls.from_pretrained(where, strict=False)
    report = model.load_report
    if args.json:
        print(json.dumps({"config": model.config.to_dict(), "parameters": model.num_parameters(),
                          "source": report.source, "missing": report.missing, "unused": report.unused,
                          "unexpected": report.unexpected, "mismatched": report.mismatched}))
        return
    c = model.config
    print(f"{report.source}")
    embedding = f"embedding {c.embedding_size}, " if hasattr(c, "embedding_size") else ""  # ELECTRA's own width
    heads = f"{c.num_attention_heads} head{'s' if c.num_attention_heads != 1 else ''}"
    print(f"{cls.__name__}: {c.num_hidden_layers} layers, hidden {c.hidden_size}, {embedding}{heads}, "
          f"intermediate {c.intermediate_size}, vocab {c.vocab_size}, max positions {c.max_position_embeddings}")
    print(f"parameters: {model.num_parameters():,}")
    print(f"weights: {report.describe()}")


def _static_info(args):
    loaded = bertkit.load(args.path)
    c, rows = loaded.config, loaded.model.embedding.weight.shape[0]
    if args.json:
        print(json.dumps({"static": True, "rows": rows, "dim": c.hidden_size, "normalize": c.normalize,
                          "max_length": c.max_length, "parameters": rows * c.hidden_size}))
        return
    print(f"{loaded.directory}")
    print(f"static embedding model: {rows:,} rows x {c.hidden_size} (a text's vector: the mean of its tokens' rows"
          f"{', normalised' if c.normalize else ''}; cut at {c.max_length or 'no'} tokens); no layers or heads")
    print(f"parameters: {rows * c.hidden_size:,}")


def add_export(sub):
    p = sub.add_parser("export", help="export a model for deployment (ONNX)")
    esub = p.add_subparsers(dest="export_command", metavar="FORMAT", required=True)
    o = esub.add_parser(
        "onnx",
        help="export the encoder or a fine-tuned head to ONNX, checked against ONNX Runtime",
        description="Write OUT_DIR/model.onnx (inputs input_ids, attention_mask, token_type_ids; outputs "
        "last_hidden_state and pooler_output for the encoder, logits for classification and tagging, "
        "start_logits and end_logits for QA; dynamic batch and sequence axes) with config.json and the "
        "tokenizer files beside it. ONNX Runtime's outputs are checked against bertkit's on real text "
        "(max abs diff 1e-4). Needs the onnx extra: pip install 'bertkit[onnx]'.",
        epilog="examples:\n  bertkit export onnx out/sst2 -o deploy/sst2\n"
        "  bertkit export onnx default -o deploy/minilm      # the packaged default model\n"
        "  bertkit export onnx runs/pretrain -o deploy/enc --encoder   # a pre-training run's encoder",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    o.add_argument("model_dir", help="a model directory (a fine-tuned output or a checkpoint), or 'default'")
    o.add_argument("-o", "--output", required=True, help="directory to write model.onnx and the tokenizer into")
    o.add_argument("--opset", type=int, default=17, help="ONNX opset version (default 17, at least 14)")
    o.add_argument("--encoder", action="store_true",
                   help="export the encoder alone (last_hidden_state, pooler_output where it has a pooler): how a "
                        "pre-training run (MLM, NSP, ELECTRA) exports, or a fine-tuned model's body")
    o.set_defaults(handler=run_export_onnx, outputs={"--output": "folder"})


def run_export_onnx(args):
    from bertkit.runtime.export import export_onnx

    report = export_onnx(None if args.model_dir == "default" else args.model_dir, args.output, opset=args.opset,
                         encoder=args.encoder)
    print(report.describe())
