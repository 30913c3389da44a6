"""The compute per step of BERT-MLM and ELECTRA pre-training, and the steps a wall-clock budget buys each.

ELECTRA's claim (Clark et al. 2020, section 3.3) is about equal *compute*: its step
costs more than masked LM's (a generator runs first, and the discriminator reads
every token), so "the same budget" means fewer ELECTRA steps. This script measures
that cost on the run's own data and model, in one process, so both methods see the
same machine load:

- both models are built as `bertkit pretrain run` builds them (`build_model`, the
  fast path of `prepare_model`, the run's AdamW), the discriminator / BERT in the
  same --config shape, the generator --generator-size of it;
- one step = collate a micro-batch from the prepared data (dynamic masking; ELECTRA
  also draws its sampling seed) + forward + backward + gradient clipping + AdamW:
  what the training loop does per update, without logging or evaluation;
- the two are timed interleaved (bench/harness.py), median of --rounds rounds of
  --steps steps each;
- FLOPs per step are counted by `torch.utils.flop_counter.FlopCounterMode` over
  one forward + backward (matrix products and attention; element-wise work is
  not counted).

It prints both, and the step count --budget-minutes of training buys each:

    OMP_NUM_THREADS=1 taskset -c 0 python bench/pretrain_cost.py DATA --config l4h128.json \\
        --batch-size 64 --budget-minutes 20 --threads 1 --json OUT/cost.json

Smoke run: `--rounds 1 --steps 1` on any prepared data with --objective none.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from harness import interleaved, load_line, machine_line  # noqa: E402

METHODS = ("bert", "electra")


def make_step(method: str, args):
    """(step, model, (plain_model, batch)): one optimizer update of `method` per call of step(), the
    model it trains, and what count_flops reads."""
    import torch

    from bertkit.pretraining.held_out import open_prepared
    from bertkit.pretraining.run_config import RunConfig
    from bertkit.pretraining.train import BatchStream, build_model, with_sample_seed
    from bertkit.training.distributed import DistInfo
    from bertkit.training.loop import prepare_model
    from bertkit.training.optim import build_optimizer

    cfg = RunConfig(data=args.data, config=args.config, method=method, batch_size=args.batch_size,
                    generator_size=args.generator_size, dropout=args.dropout, seed=args.seed,
                    eval_every=0, device="cpu")
    cfg.optim.learning_rate = args.learning_rate
    dataset, train_set, _, collate, _ = open_prepared(cfg, cfg.seed)
    if method == "electra":
        collate = with_sample_seed(collate)
    model = prepare_model(build_model(cfg, dataset.vocab_size, dataset.objective), DistInfo())
    optimizer = build_optimizer(model, cfg.optim)
    stream = BatchStream(train_set, cfg.batch_size, collate, cfg.seed)

    def step():
        batch, _ = stream.micro_batch(0)
        stream.advance(1)
        model(**batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    # FLOPs are counted on the plain layers: the fused fast path calls kernels the counter cannot see
    plain = build_model(cfg, dataset.vocab_size, dataset.objective).train()
    return step, model, (plain, stream.micro_batch(0)[0])


def count_flops(model, batch) -> float:
    """Forward + backward FLOPs of one micro-batch (matrix products and attention)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        model(**batch).loss.backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", help="a directory made by `bertkit pretrain prepare --objective none`")
    p.add_argument("--config", default="tiny", help="the discriminator's / BERT's shape: a preset or a config.json")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--generator-size", type=float, default=0.25)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--steps", type=int, default=10, help="optimizer steps per timed call")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--budget-minutes", type=float, default=20.0, help="the wall-clock budget to convert into steps")
    p.add_argument("--json", type=Path, help="also write the numbers here")
    args = p.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    steps, models = {}, {}
    for method in METHODS:
        step, model, plain_and_batch = make_step(method, args)
        models[method] = (model, plain_and_batch)
        steps[method] = lambda step=step: [step() for _ in range(args.steps)]
    flops = {m: count_flops(*models[m][1]) for m in METHODS}
    times = interleaved(steps, rounds=args.rounds, warmup=1)
    tokens = float(models["bert"][1][1]["attention_mask"].sum())
    result = {"machine": f"{machine_line()}; {load_line()}", "precision": "fp32", "threads": torch.get_num_threads(),
              "batch_size": args.batch_size, "tokens_per_step": tokens, "budget_minutes": args.budget_minutes, "methods": {}}
    print(f"machine: {result['machine']}; {result['threads']} thread(s)")
    print(f"fp32 (no autocast), batch {args.batch_size}, {tokens:.0f} real tokens in the first batch; median of {args.rounds} rounds "
          f"of {args.steps} steps, interleaved\n")
    print("| method | s/step | tokens/s | GFLOPs/step (fwd+bwd) | steps in the budget |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for m in METHODS:
        s = statistics.median(times[m]) / args.steps
        budget_steps = int(args.budget_minutes * 60 / s)
        result["methods"][m] = {"s_per_step": s, "rounds_s_per_step": [t / args.steps for t in times[m]],
                                "flops_per_step": flops[m], "budget_steps": budget_steps,
                                "parameters": sum(q.numel() for q in models[m][0].parameters())}
        print(f"| {m} | {s:.3f} | {tokens / s:,.0f} | {flops[m] / 1e9:.1f} | {budget_steps} |")
    ratio = result["methods"]["electra"]["s_per_step"] / result["methods"]["bert"]["s_per_step"]
    print(f"\nan ELECTRA step costs {ratio:.2f}x a BERT-MLM step in time, "
          f"{flops['electra'] / flops['bert']:.2f}x in counted FLOPs")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
