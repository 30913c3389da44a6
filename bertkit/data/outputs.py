"""An output folder that already holds something is not written over silently.

`bertkit finetune ... -o DIR` into a model folder replaced its weights and config.json and
left the old modules.json and sentence-transformers files beside them: a folder that lies
about itself. `check_output` refuses such a folder in one line, unless the user says
`--overwrite` (then `clear_output` removes what a model, a run or an index is made of, and
only that, so no stale file describes the new model) or `--resume` (continue the run there).
Whatever the flags, the output may not be the folder the job reads its model from
(`--model X -o X` would destroy the source as it trains). `run_output` is the three steps around a run
(fine-tuning, `distill layers`): checked, locked while it writes (`bertkit.data.lock`), cleared under --overwrite.

What counts (by file name; see HOLDS):

    a model    config.json, model.safetensors (and its shards' index), pytorch_model.bin,
               model.int8.safetensors, modules.json, sentence_bert_config.json, ...
    a run      run_config.json, metrics.jsonl, checkpoints/
    an index   index.json, build.json (an unfinished one)
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from bertkit.data.lock import LOCK_FILE, first_process, folder_lock
from bertkit.errors import BertkitError

HOLDS = {  # a run's folder holds its model too: it is named a run (and --resume offered)
    "a run": ("run_config.json", "metrics.jsonl", "checkpoints"),
    "an index": ("index.json", "build.json"),
    "a model": ("config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "model.int8.safetensors", "modules.json", "sentence_bert_config.json",
                "config_sentence_transformers.json", "bertkit_task.json"),
}
# what --overwrite removes beside HOLDS' names: the rest of what a model, run or index writes
ALSO_WRITTEN = ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json", "1_Pooling",
                "2_Normalize", "generator", "metrics.json", "predictions.jsonl", "passages.jsonl",
                "vectors.safetensors", "hnsw.faiss", "parts")


def holds(folder, kinds: dict = HOLDS) -> tuple[str, list[str]] | None:
    """(what, the names that say so) for the first kind of output (of `kinds`) `folder` holds; None if none."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    for what, names in kinds.items():
        found = [n for n in names if (folder / n).exists()]
        if found:
            return what, found
    return None


def check_output(output, *, overwrite: bool, resume: bool = False, sources=(), flag: str = "--output",
                 kinds: dict = HOLDS, call: str | None = None) -> None:
    """Refuse an `output` that is one of `sources` (the folders the job reads: a list of the model's, or
    {what is read: folder}), or that already holds a model, run or index (or what `kinds` names: another
    command's own output, {what: file names}) while neither `overwrite` nor `resume` is given. `call`: the
    Python function that takes `overwrite=True` too (named beside --overwrite: a caller of it has no flags)."""
    output = Path(output)
    named = sources.items() if isinstance(sources, dict) else (("the model", source) for source in sources)
    for what, source in named:
        if source is not None and Path(source).exists() and Path(source).resolve() == output.resolve():
            raise BertkitError(f"{flag} {output} is the folder {what} is read from: the job would overwrite its "
                               f"own source; write to another {flag}")
    if resume or overwrite:
        return
    held = holds(output, kinds)
    if held is not None:
        what, names = held
        how = f"--overwrite ({call}(overwrite=True))" if call else "--overwrite"
        raise BertkitError(f"{output} already holds {what} ({', '.join(names[:3])}): pass {how} to replace it"
                           f"{', --resume to continue its run' if what == 'a run' else ''}, or choose another {flag}")


def clear_output(output) -> list[str]:
    """Remove what a model, run or index is made of from `output` (nothing else); returns the names removed."""
    output = Path(output)
    removed = []
    for name in (*[n for names in HOLDS.values() for n in names], *ALSO_WRITTEN):
        path = output / name
        if name == LOCK_FILE or not (path.exists() or path.is_symlink()):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        removed.append(name)
    return removed


@contextlib.contextmanager
def run_output(output, command: str, *, overwrite: bool, resume: bool, sources=(), log=print):
    """The block of a run that writes `output`: the folder checked first (`check_output`), then, on the process
    that writes (`first_process`), locked for the block and, under `overwrite` without `resume`, cleared of the
    model, run or index it held (`clear_output`). It yields the log the block prints with: `log` on that
    process, a silent one on torchrun's others (they run the same command: each line was printed N times)."""
    check_output(output, overwrite=overwrite, resume=resume, sources=sources)
    if not first_process():
        yield lambda line: None
        return
    with folder_lock(output, command):
        if overwrite and not resume:
            removed = clear_output(output)
            if removed:
                log(f"--overwrite: removed {', '.join(removed)} from {output}")
        yield log
