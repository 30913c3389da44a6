"""ELECTRA pre-training throughput: bertkit's step against transformers doing the same work.

One step = generator forward (MLM loss) + sampling the replacements from its softmax
(no gradient) + discriminator forward on the corrupted text (binary loss over real
tokens) + backward of MLM + 50 x discriminator loss + AdamW, on the same batches:

- ours: `bertkit.model.electra_pretraining.ElectraPretrainingModel` after `bertkit.runtime.fast.accelerate(model,
  training=True)`; the generator projects onto the vocabulary only at the masked positions;
- ours, plain: the same model without `accelerate` (plain PyTorch layers);
- peer: `transformers.ElectraForMaskedLM` (generator) + `ElectraForPreTraining`
  (discriminator) sharing one embedding module, the generator's decoder tied to it, the
  step written out as above; its generator projects every position onto the vocabulary.

Same shapes (discriminator and its 1/4 generator), dropout on, float32, synthetic batches
with 15% of the real tokens masked (all [MASK]) and some padding; times interleaved in one
process (bench/harness.py), reported as real tokens/s; the ratio line comes with the CPU's
features. Smoke run: `--layers 1 --batch-size 2 --seq-len 32 --rounds 1`.

    python bench/bench_electra.py [--write] [--rounds 3] [--batch-size 16] [--seq-len 128]
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from harness import interleaved, load_line, machine_line, report, table  # noqa: E402

MASK_ID = 103  # bert-base-uncased's [MASK]


def make_batches(steps: int, batch_size: int, seq_len: int, vocab_size: int, seed: int = 0):
    """Random ids with a padded tail on every other row, 15% of the real non-special tokens masked."""
    import torch

    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        ids = torch.randint(1000, vocab_size, (batch_size, seq_len), generator=g)
        mask = torch.ones_like(ids)
        mask[1::2, seq_len * 3 // 4:] = 0
        ids = ids * mask
        ids[:, 0] = 101  # [CLS]
        chosen = (torch.rand(ids.shape, generator=g) < 0.15) & mask.bool()
        chosen[:, 0] = False
        labels = torch.where(chosen, ids, torch.full_like(ids, -100))
        masked = torch.where(chosen, torch.full_like(ids, MASK_ID), ids)
        batches.append(dict(input_ids=masked, labels=labels, attention_mask=mask,
                            token_type_ids=torch.zeros_like(ids)))
    return batches


def make_ours(config, batches, fast: bool):
    import torch

    from bertkit.model.electra_pretraining import ElectraPretrainingModel
    from bertkit.runtime.fast import accelerate

    model = ElectraPretrainingModel(config, generator=torch.Generator().manual_seed(0)).train()
    if fast:
        accelerate(model, training=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = torch.Generator().manual_seed(1)
    state = {"i": 0}

    def step():
        batch = batches[state["i"] % len(batches)]
        state["i"] += 1
        loss = model(**batch, rng=rng).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def make_peer(config, batches):
    import torch
    import transformers

    def hf(c):
        return transformers.ElectraConfig(**{k: v for k, v in c.to_dict().items() if k not in ("architectures",)})

    torch.manual_seed(0)
    disc = transformers.ElectraForPreTraining(hf(config)).train()
    gen = transformers.ElectraForMaskedLM(hf(config.generator_config())).train()
    gen.electra.embeddings = disc.electra.embeddings  # shared, as in ELECTRA
    gen.generator_lm_head.weight = disc.electra.embeddings.word_embeddings.weight  # tied decoder
    both = torch.nn.ModuleList([gen, disc])
    opt = torch.optim.AdamW(both.parameters(), lr=1e-4)  # parameters() yields a shared tensor once
    rng = torch.Generator().manual_seed(1)
    state = {"i": 0}

    def step():
        b = batches[state["i"] % len(batches)]
        state["i"] += 1
        out = gen(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                  token_type_ids=b["token_type_ids"], labels=b["labels"])
        masked = b["labels"] != -100
        with torch.no_grad():
            probs = out.logits[masked].float().softmax(-1)
            sampled = torch.multinomial(probs, 1, generator=rng).squeeze(1)
        corrupted = b["input_ids"].clone()
        corrupted[masked] = sampled
        original = torch.where(masked, b["labels"], b["input_ids"])
        replaced = (corrupted != original).long()
        d = disc(input_ids=corrupted, attention_mask=b["attention_mask"],
                 token_type_ids=b["token_type_ids"], labels=replaced)
        (out.loss + 50.0 * d.loss).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--embedding-size", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    args = parser.parse_args(argv)

    import torch

    from bertkit.model.electra import ElectraConfig

    config = ElectraConfig(num_hidden_layers=args.layers, hidden_size=args.hidden, num_attention_heads=args.heads,
                           intermediate_size=4 * args.hidden, embedding_size=args.embedding_size)
    batches = make_batches(4, args.batch_size, args.seq_len, config.vocab_size)
    tokens = float(sum(b["attention_mask"].sum() for b in batches)) / len(batches)
    contenders = {
        "bertkit": make_ours(config, batches, fast=True),
        "bertkit, plain layers": make_ours(config, batches, fast=False),
        "transformers": make_peer(config, batches),
    }
    times = interleaved(contenders, rounds=args.rounds, warmup=1)
    gen = config.generator_config()
    note = (f"ELECTRA step (generator + sampling + discriminator, forward + backward + AdamW), fp32, "
            f"discriminator {args.layers} layers x hidden {args.hidden} (embedding {args.embedding_size}), "
            f"generator hidden {gen.hidden_size} / {gen.num_attention_heads} heads, batch {args.batch_size} x "
            f"{args.seq_len}, {torch.get_num_threads()} threads. {machine_line('transformers')}; {load_line()}.")
    report("electra", table("ELECTRA pre-training step", tokens, "tokens", times, "bertkit", note), args.write)


if __name__ == "__main__":
    main()
