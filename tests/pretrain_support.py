"""Helpers shared by the pre-training loop tests: tiny data, tiny model, CLI runs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

# odd sizes make swapped dimensions fail loudly
TINY_MODEL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 37,
              "max_position_embeddings": 64, "vocab_size": 30522}

BOOKS = ("stevenson__the_strange_case_of_dr_jekyll_and_mr_hyde.txt", "james__daisy_miller_a_study.txt",
         "wilde__the_happy_prince_and_other_tales.txt")


def make_prepared_data(shared_data: Path, tmp: Path, chars: int = 25_000, objective: str = "nsp") -> Path:
    """A slice of three shared books, prepared at length 32 with dynamic masking."""
    from bertkit.pretraining.prepare import PrepareConfig, prepare

    corpus = tmp / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for name in BOOKS:
        text = (shared_data / "pretrain_corpus" / "gutenberg" / name).read_text(encoding="utf-8")
        (corpus / name).write_text(text[:chars], encoding="utf-8")
    cfg = PrepareConfig(max_seq_length=32, objective=objective, dynamic_masking=True, dupe_factor=1,
                        documents="file", workers=1, seed=3)
    prepare([corpus], tmp / "data", cfg, progress=False)
    return tmp / "data"


def tiny_config_file(tmp: Path) -> Path:
    path = tmp / "tiny.json"
    path.write_text(json.dumps(TINY_MODEL))
    return path


KILLED_RUN = Path(__file__).resolve().parent / "killed_run.py"


def bertkit_cmd(*args) -> list:
    return [sys.executable, "-m", "bertkit.cli", *map(str, args)]


def run_cli(*args, env=None, check=True, timeout=240, kill_at_step=None) -> subprocess.CompletedProcess:
    """`bertkit ARGS` in a fresh process (same thread count as this one, for exact comparisons);
    with `kill_at_step` the process SIGKILLs itself in that update (from 0), see killed_run.py."""
    full_env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads()), **(env or {})}
    cmd = bertkit_cmd(*args) if kill_at_step is None else [sys.executable, str(KILLED_RUN), str(kill_at_step),
                                                           *map(str, args)]
    res = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise AssertionError(f"bertkit {' '.join(map(str, args))} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return res


def refusal(capsys, *args) -> tuple:
    """`bertkit ARGS` through the command's main in this process: (status, stderr). For the refusals, which need
    no real process: a fresh one costs a torch import (~4 s of CPU) to print one line."""
    from bertkit.cli import main

    capsys.readouterr()
    status = main([str(a) for a in args])
    return status, capsys.readouterr().err


def train_losses(run_dir: Path) -> dict:
    """step -> training loss, from metrics.jsonl."""
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line]
    return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}
