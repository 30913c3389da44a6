"""When the machine says no: a full disk, a file-size limit, a folder the command may not write, an output
path that runs through a file, standard output on a full device.

Each is said in one line, `bertkit: error: FILE: CAUSE (what to do)`, exit status 2, naming the file the user
asked for (not our NAME.tmp or NAME.part) and no errno soup; an unwritable place is refused before a model
loads; the file that stood at the name survives, nothing half-written is left beside it, and a resumable job
goes on once the disk has room. The disk is made "full" with a real file-size limit (RLIMIT_FSIZE, SIGXFSZ
ignored: the kernel then refuses a write past it with EFBIG), set in this process around one call.
"""

import contextlib
import errno
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bertkit.cli import main
from bertkit.errors import BertkitError

ROOT = Path(__file__).resolve().parent.parent
OLD = b"the file a previous run wrote\n"


@contextlib.contextmanager
def file_size_limit(nbytes: int):
    """No file of this process may grow past `nbytes` in the block: a write past it fails with EFBIG."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("bertkit: error: ")]
    assert len(lines) == 1 and "Traceback" not in err and "[Errno" not in err, err
    return lines[0]


def texts(tmp_path: Path, n: int = 40) -> Path:
    path = tmp_path / "texts.txt"
    path.write_text("".join(f"sentence number {i} about a cat\n" for i in range(n)), encoding="utf-8")
    return path


@pytest.mark.parametrize("name, limit", [("v.npy", 2000), ("v.npy", 5200), ("v.safetensors", 5150),
                                         ("v.jsonl", 2000)])
def test_embed_past_a_file_size_limit_says_so_in_one_line_and_keeps_the_old_file(tiny_dir, tmp_path, capsys,
                                                                                 name, limit):
    """40 vectors of 32 float32 are 5,120 bytes: past 2,000 the rows are refused, past 5,200 the last of them (a
    header of 128 bytes before them; main refused its spool v.npy.part there, then the copy). Was: a traceback
    ending in "OSError: [Errno 27] File too large", naming no file."""
    out = tmp_path / name
    out.write_bytes(OLD)
    source = texts(tmp_path)
    with file_size_limit(limit):
        code = main(["embed", str(source), "-o", str(out), "--model", str(tiny_dir), "--quiet"])
    assert code == 2
    line = one_error_line(capsys)
    assert line.startswith(f"bertkit: error: {out}: File too large (") and "ulimit -f" in line, line
    assert out.read_bytes() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, source.name])


def test_weights_and_checkpoints_past_a_limit_name_their_file_and_errno(tmp_path):
    """safetensors (SafetensorError "... (os error 27)") and torch.save (RuntimeError "unexpected pos") lose the
    errno of a refused write: the writer gives it back, naming the file asked for, and the old file stands."""
    import torch

    from bertkit.model.checkpoint import save_tensors
    from bertkit.training.state import save_checkpoint

    import numpy as np

    from bertkit.data.atomic import replace_atomically

    array = tmp_path / "part-00000.npy"  # an index's part: numpy said "80000 requested and 16256 written"
    with file_size_limit(20_000), pytest.raises(OSError) as numpy_err:
        replace_atomically(array, lambda f: np.save(f, np.zeros(20_000, dtype=np.float32)))
    assert (numpy_err.value.errno, numpy_err.value.filename) == (27, str(array)) and not array.exists()
    weights = tmp_path / "model.safetensors"
    save_tensors(weights, {"w": torch.arange(4.0)}, {"format": "pt"})
    checkpoint = save_checkpoint(tmp_path, 2, {"w": torch.arange(4.0)})
    before = {p: p.read_bytes() for p in (weights, checkpoint)}
    with file_size_limit(20_000):
        with pytest.raises(OSError) as weights_err:
            save_tensors(weights, {"w": torch.zeros(10_000)}, {"format": "pt"})
        with pytest.raises(OSError) as checkpoint_err:
            save_checkpoint(tmp_path, 2, {"w": torch.zeros(10_000)})
    for err, path in ((weights_err.value, weights), (checkpoint_err.value, checkpoint)):
        assert (err.errno, err.filename) == (27, str(path)), repr(err)
        assert path.read_bytes() == before[path]
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["checkpoints", "model.safetensors", "step-00000002.pt"]


def test_an_index_cut_short_by_the_disk_resumes_to_the_index_an_uninterrupted_build_writes(tiny_dir, tmp_path,
                                                                                          capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(f'{{"_id": "d{i}", "title": "", "text": "document {i} is about cats and the number '
                              f'{i * 7}"}}\n' for i in range(60)), encoding="utf-8")
    argv = ["index", str(corpus), "--model", str(tiny_dir), "--part-size", "16", "--no-lexical", "--quiet"]
    assert main([*argv, "-o", str(tmp_path / "straight")]) == 0
    capsys.readouterr()
    cut, vectors = tmp_path / "cut", tmp_path / "straight" / "vectors.safetensors"
    # room for the passages and each part, not for the vectors they are joined into at the end
    assert (tmp_path / "straight" / "passages.jsonl").stat().st_size < vectors.stat().st_size
    with file_size_limit(vectors.stat().st_size - 1):
        assert main([*argv, "-o", str(cut)]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"bertkit: error: {cut / 'vectors.safetensors'}: File too large (") and "--resume" in line
    assert not (cut / "index.json").exists()  # nothing there reads as a finished index
    assert main([*argv, "-o", str(cut), "--resume"]) == 0  # the disk has room again
    for name in ("vectors.safetensors", "passages.jsonl"):
        assert (cut / name).read_bytes() == (tmp_path / "straight" / name).read_bytes(), name


def test_standard_output_on_a_full_device_is_one_line(tmp_path):
    """`tokenize --json > /dev/full` (a full disk behind `>`) ended in a traceback through print, naming nothing."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    source = texts(tmp_path, 2000)
    with open(source) as stdin, open("/dev/full", "w") as stdout:
        done = subprocess.run([sys.executable, "-m", "bertkit.cli", "tokenize", "--json"], stdin=stdin,
                              stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("bertkit: error: standard output: No space left on device (the disk is full") \
        and done.stderr.count("\n") == 1, done.stderr
    # started with standard output closed (`>&-`), Python's is None and print() writes nothing: still so
    closed = subprocess.run([sys.executable, "-m", "bertkit.cli", "tokenize", "hello"], preexec_fn=lambda: os.close(1),
                            stderr=subprocess.PIPE, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (closed.returncode, closed.stderr) == (0, ""), closed.stderr


def test_an_output_through_a_file_is_refused_before_the_model_loads(tmp_path, capsys):
    """`embed -o notes.txt/sub/v.npy` made its folders only once every text was embedded: FileExistsError's
    traceback. Refused now before anything loads: the model named here does not even exist."""
    (tmp_path / "notes.txt").write_text("a file\n")
    source, model = str(texts(tmp_path, 3)), str(tmp_path / "no-model")
    for argv in (["embed", source, "--model", model, "-o", "notes.txt/sub/v.npy"],
                 ["predict", model, source, "--output", "notes.txt/p.tsv"],
                 ["finetune", "classify", "--train", source, "--model", model, "-o", "notes.txt/run"],
                 ["vocab", "train", source, "-o", "notes.txt/vocab.txt"]):
        argv[-1] = str(tmp_path / argv[-1])
        assert main(argv) == 2, argv
        assert f"{tmp_path / 'notes.txt'} is a file, not a folder" in one_error_line(capsys), argv
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "texts.txt"]


def without_root_powers() -> list:
    """The command prefix that makes file permissions apply: none for a user; for root, setpriv dropping the
    capabilities that let root read and write whatever the permissions say (skipped where it cannot)."""
    if os.geteuid() != 0:
        return []
    drop = ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search,-fowner"]
    if not shutil.which("setpriv") or subprocess.run([*drop, "true"], capture_output=True).returncode != 0:
        pytest.skip("running as root, whom file permissions do not stop, and setpriv cannot drop that power here")
    return drop


def bertkit_as_a_user(*args) -> subprocess.CompletedProcess:
    return subprocess.run([*without_root_powers(), sys.executable, "-m", "bertkit.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_folder_without_write_permission_is_refused_before_anything_loads(tmp_path):
    """A read-only output folder was found where the first file was written: `embed`, `predict` and `vocab train`
    after all the work, saying "[Errno 13] Permission denied: '.../v.npy.part'", our spool's name."""
    locked = tmp_path / "locked"
    locked.mkdir()
    source = texts(tmp_path, 3)
    locked.chmod(0o500)
    try:
        for argv in (["embed", source, "--model", tmp_path / "no-model", "-o", locked / "sub" / "v.npy"],
                     ["vocab", "train", source, "-o", locked / "vocab"]):
            done = bertkit_as_a_user(*argv)
            assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
            assert done.stderr == (f"bertkit: error: --output {argv[-1]}: the folder {locked} cannot be written "
                                   "(no write permission): write elsewhere\n"), done.stderr
    finally:
        locked.chmod(0o700)
    assert list(locked.iterdir()) == []


def test_a_corpus_file_the_user_may_not_read_stops_the_command(tmp_path):
    """vocab train and pretrain prepare skipped such a file as "unreadable (I/O error or corrupt gzip)", counted
    in the summary, and went on without it: a vocabulary (or a data set) silently made from part of the corpus,
    for a cause the user fixes with chmod. It stops the command now, named, as an unreadable input does anywhere."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("a.txt", "b.txt"):
        (corpus / name).write_text("the cat sat on the mat .\nthe dog ran .\n" * 20)
    (corpus / "b.txt").chmod(0o000)
    done = bertkit_as_a_user("vocab", "train", corpus, "-o", tmp_path / "vocab", "--vocab-size", "120")
    assert done.returncode == 2, done.stderr  # was 0: a vocabulary of a.txt alone
    assert done.stderr.splitlines()[-1] == f"bertkit: error: {corpus / 'b.txt'}: Permission denied (check its " \
                                           "permissions and its folder's (ls -ld), or use another path)", done.stderr
    assert not (tmp_path / "vocab").exists()


def test_an_unreadable_input_names_it_without_errno_soup(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("[PAD]\n[UNK]\n")
    secret.chmod(0o000)
    done = bertkit_as_a_user("tokenize", "hello", "--vocab", secret)
    assert done.returncode == 2
    assert done.stderr == f"bertkit: error: {secret}: Permission denied (check its permissions and its folder's " \
                          "(ls -ld), or use another path)\n", done.stderr  # was: [Errno 13] Permission denied: '...'


CONSOLIDATE_ON_A_SMALL_DISK = """
import json, subprocess, sys
from pathlib import Path
import numpy as np
from bertkit.data.corpus import CorpusStats
from bertkit.pretraining.shards import consolidate
here, small = Path(sys.argv[1]), Path(sys.argv[2])
shards = []
for i in range(2):  # two shards of 50,000 tokens (100 kB each as uint16): the disk holds 64 kB
    shard = here / f"shard{i}"
    shard.mkdir()
    np.save(shard / "tokens.npy", np.arange(50_000, dtype=np.uint16) % 30000)
    np.save(shard / "sentences.npy", np.full(100, 500, dtype=np.int64))
    np.save(shard / "documents.npy", np.full(10, 10, dtype=np.int64))
    stats = CorpusStats(files=1, documents=10, sentences=100, tokens=50_000)
    (shard / "stats.json").write_text(json.dumps({"stats": stats.to_dict()}))
    shards.append(shard)
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)], check=True)
import bertkit.pretraining.shards as shards_module
for look_ahead in (True, False):  # refused by its size, known ahead; then, unchecked, by the disk (no SIGBUS)
    try:
        consolidate(shards, small / "corpus", vocab_size=30522)
    except OSError as err:
        print("refused", err.errno, err.strerror or str(err).split(": ", 1)[-1][:58])
    shards_module.room_for = lambda *args: None
"""


EMBED_ON_A_SMALL_DISK = """
import subprocess, sys
from pathlib import Path
import numpy as np
from bertkit.data.vector_files import write_vectors
small = Path(sys.argv[1])
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)], check=True)
rows = (np.full(32, i, dtype=np.float32) for i in range(300))  # 38,400 bytes of vectors: once fits, twice not
for name, pooled in (("v.npy", True), ("v.safetensors", False)):
    try:
        print(name, write_vectors(rows if pooled else (np.ones((2, 32), np.float32) for _ in range(150)),
                                  small / name, pooled=pooled), sorted(p.name for p in small.iterdir()))
    except OSError as err:
        print(name, "refused", err.errno)
    (small / name).unlink(missing_ok=True)
"""


def small_disk_works(tmp_path) -> Path:
    """A folder on which a small tmpfs can be mounted in a user and mount namespace of its own (unshare -rm)."""
    small = tmp_path / "small"
    small.mkdir()
    probe = subprocess.run(["unshare", "-rm", "mount", "-t", "tmpfs", "tmpfs", str(small)], capture_output=True) \
        if shutil.which("unshare") else None
    if probe is None or probe.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (unshare -rm: no user namespaces?)")
    return small


def test_embed_needs_the_room_of_its_output_once(tmp_path):
    """embed spooled every vector into NAME.part, then copied it into NAME.tmp: twice the output's room at the end,
    so a disk that held the vectors failed at the copy, after every text was embedded (and lost them all). The
    vectors now go straight into NAME.tmp after a header of a fixed size, filled in at the end."""
    small = small_disk_works(tmp_path)
    done = subprocess.run(["unshare", "-rm", sys.executable, "-c", EMBED_ON_A_SMALL_DISK, str(small)],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["v.npy 300 ['v.npy']", "v.safetensors 150 ['v.safetensors']"], done.stdout


def test_pretrain_prepare_on_a_full_disk_is_an_error_not_a_bus_error(tmp_path):
    """consolidate (pretrain prepare's corpus/) filled memory maps of sparse files: on a full disk a write into
    the map has no block to go to, and the kernel kills the process with SIGBUS: "Bus error", no message, its
    lock and temporary folder left. A real full disk: a 64 kB tmpfs, mounted in a user and mount namespace of
    its own (unshare -rm: no root needed where user namespaces are allowed); skipped where it cannot be."""
    small = small_disk_works(tmp_path)
    done = subprocess.run(["unshare", "-rm", sys.executable, "-c", CONSOLIDATE_ON_A_SMALL_DISK, str(tmp_path),
                           str(small)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode != -signal.SIGBUS, "Bus error"
    assert done.returncode == 0 and done.stdout.splitlines() == [
        "refused None the consolidated corpus's tokens and offsets need at least", "refused 28 No space left on device"], \
        (done.returncode, done.stdout, done.stderr)


def test_an_index_takes_its_vectors_blocks_before_it_maps_them(tiny_dir, tmp_path, monkeypatch):
    """The index wrote vectors.safetensors through a memory map of a file made sparse (truncate): on a full disk
    a write into the map had no block, and `bertkit index` died with "Bus error" (SIGBUS, no message, its lock
    and vectors.safetensors.tmp left; seen on a 500 kB tmpfs). Each file mapped for writing must already hold
    its blocks (st_blocks), so that the disk said no earlier, as ENOSPC."""
    import numpy as np

    real_memmap, mapped = np.memmap, []

    def checked(filename, dtype=np.uint8, mode="r+", offset=0, shape=None, **kw):
        if mode in ("r+", "w+"):
            end = offset + int(np.prod(shape)) * np.dtype(dtype).itemsize
            mapped.append((Path(filename).name, os.stat(filename).st_blocks * 512 >= end))
        return real_memmap(filename, dtype=dtype, mode=mode, offset=offset, shape=shape, **kw)

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(f'{{"_id": "d{i}", "text": "document {i} is about cats"}}\n' for i in range(300)))
    monkeypatch.setattr(np, "memmap", checked)
    assert main(["index", str(corpus), "-o", str(tmp_path / "idx"), "--model", str(tiny_dir), "--no-lexical",
                 "--quiet"]) == 0
    assert mapped == [("vectors.safetensors.tmp", True)]  # was: False, a sparse file


@pytest.mark.parametrize("limit, file", [(3000, "tokens/00000/tokens.npy"), (20_000, "instances/00000/masked_ids.npy")])
def test_pretrain_prepare_past_a_limit_says_why(tmp_path, capsys, limit, file):
    """numpy writes a .npy's data with fwrite, and a refused write reached the user as "bertkit: error: 16896
    requested and 8128 written": no cause, no file. 3,000 bytes stop the first shard's tokens.npy (2,400 tokens,
    2 bytes each), 20,000 a block of instances (its masked ids, 40 kB) after the corpus (10 kB); run again with
    room, prepare finishes. The line names the file in the folder the user asked for (it named none: "bertkit:
    error: File too large (...)"), and the half-written folder is gone (its .NNNNN.tmp-PID/ stayed)."""
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "a", "mat", "dog", "ran", "."]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(2):
        (corpus / f"{i}.txt").write_text("".join(f"the cat sat on a mat {j} . the dog ran .\n\n" for j in range(200)))
    argv = ["pretrain", "prepare", str(corpus), "-o", str(tmp_path / "data"), "--vocab", str(tmp_path / "vocab.txt"),
            "--max-seq-length", "16", "--workers", "1", "--quiet"]
    with file_size_limit(limit):
        assert main(argv) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"bertkit: error: {tmp_path / 'data' / file}: File too large (over this process's "
                           "file-size limit"), line
    assert not [p.name for p in (tmp_path / "data").rglob("*") if ".tmp" in p.name]
    assert main(argv) == 0 and (tmp_path / "data" / "manifest.json").is_file()


def test_a_teacher_cache_past_a_limit_is_one_line_and_leaves_no_temporary_file(tiny_dir, tmp_path, capsys):
    """distill layers --teacher-cache wrote each chunk with safetensors under a temporary name of its own: a full
    disk ended in SafetensorError's traceback (exit 1) and left CACHE.XXXXXXXX.tmp, a new one each try."""
    data = texts(tmp_path, 30)
    cache = tmp_path / "teacher.safetensors"
    argv = ["distill", "layers", str(tiny_dir), "--keep", "1", "--data", str(data), "-o", str(tmp_path / "student"),
            "--teacher-cache", str(cache), "--no-progress"]
    with file_size_limit(2000):  # 30 vectors of 32 float32: 3,840 bytes and a header
        assert main(argv) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"bertkit: error: {cache}.part/000000.safetensors: File too large ("), line
    assert not [p.name for p in tmp_path.rglob("*.tmp")]


def test_a_lexical_part_the_disk_refuses_leaves_no_half_folder(tmp_path):
    """The index's BM25 part is written as lexical.tmp/ and renamed: a full disk in bm25s' save left lexical.tmp/
    and its partial files (the room a user frees the disk for) until the next build removed it."""
    pytest.importorskip("bm25s")
    from bertkit.retrieval.config import LexicalOptions
    from bertkit.retrieval.lexical import build_lexical

    texts = [f"document {i} is about cats and dogs and the number {i * 7}" for i in range(400)]
    with file_size_limit(3000), pytest.raises(OSError) as refused:
        build_lexical(tmp_path, texts, LexicalOptions())
    # the folder asked for and the disk's reason (numpy's own words were "2788 requested and 718 written", no errno)
    assert (refused.value.errno, refused.value.filename) == (errno.EFBIG, str(tmp_path / "lexical"))
    assert list(tmp_path.iterdir()) == []  # was: lexical.tmp/ and its first files
    build_lexical(tmp_path, texts, LexicalOptions())  # with room again
    assert (tmp_path / "lexical" / "params.index.json").is_file()


def test_an_index_whose_lexical_part_the_disk_refuses_says_so_in_one_line(tiny_dir, tmp_path, capsys):
    """`bertkit index` (or `index add`) on a full disk while it wrote the BM25 part said numpy's words, "bertkit:
    error: 2788 requested and 718 written": no file, no cause, no advice, where every other part says the file and
    the disk's reason. Run again with room, the part is added."""
    pytest.importorskip("bm25s")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(f'{{"_id": "d{i}", "text": "document {i} is about cats and dogs and the number '
                              f'{i * 7}"}}\n' for i in range(400)))
    index = tmp_path / "idx"
    assert main(["index", str(corpus), "-o", str(index), "--model", str(tiny_dir), "--no-lexical", "--quiet"]) == 0
    capsys.readouterr()
    with file_size_limit(3000):  # room for index.json, not for the part's score matrix
        assert main(["index", "add", str(index), "--quiet"]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"bertkit: error: {index / 'lexical'}: File too large (over this process's file-size "
                           "limit"), line
    assert sorted(p.name for p in index.iterdir()) == ["index.json", "passages.jsonl", "vectors.safetensors"]
    assert main(["index", "add", str(index), "--quiet"]) == 0 and (index / "lexical" / "params.index.json").is_file()


def test_a_static_model_past_a_limit_names_its_file_in_the_folder_asked_for(tmp_path):
    """distill static writes its folder beside -o, then renames it: a write refused there named the hidden work
    folder (".out.2zn613_1/0_StaticEmbedding/model.safetensors"), a name the user never gave and that is gone by
    the time they look. It names the file under -o now, and nothing is left beside it."""
    import torch

    from bertkit.distill.static import _save
    from bertkit.model.static import StaticEmbedding
    from bertkit.text.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained()
    out = tmp_path / "out"
    with file_size_limit(200_000), pytest.raises(OSError) as refused:  # the table: 30,522 x 8 float32
        _save(StaticEmbedding(torch.randn(len(tok), 8), normalize=True), tok, out)
    assert (refused.value.errno, refused.value.filename) == (errno.EFBIG,
                                                            str(out / "0_StaticEmbedding" / "model.safetensors"))
    assert list(tmp_path.iterdir()) == []


def test_index_add_cut_short_does_not_offer_resume(tiny_dir, tmp_path, capsys):
    """The one line after a full disk (and Ctrl-C's) said "--resume goes on from the last checkpoint" for every
    command with the flag; `index add` has it and refuses it ("index add needs none"): the advice led nowhere."""
    pytest.importorskip("faiss")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(f'{{"_id": "d{i}", "text": "document {i} is about cats"}}\n' for i in range(300)))
    index = tmp_path / "idx"
    assert main(["index", str(corpus), "-o", str(index), "--model", str(tiny_dir), "--no-lexical", "--quiet"]) == 0
    capsys.readouterr()
    add = ["index", "add", str(index), "--ann", "hnsw", "--no-lexical", "--quiet"]
    with file_size_limit(3000):  # room for index.json, not for the HNSW graph of 300 vectors
        assert main(add) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"bertkit: error: {index / 'hnsw.faiss'}: File too large (") and "--resume" not in line
    assert main(add) == 0  # what it says: run it again


def test_a_qdrant_export_the_disk_refuses_is_one_line_and_resumes(tiny_dir, tmp_path, capsys):
    """index export --qdrant DIR (Qdrant's local mode keeps points in SQLite) on a full disk ended in a traceback,
    "sqlite3.OperationalError: database or disk is full" (past a file-size limit: "disk I/O error")."""
    pytest.importorskip("qdrant_client")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(f'{{"_id": "d{i}", "text": "document {i} is about cats"}}\n' for i in range(300)))
    index, store = tmp_path / "idx", tmp_path / "qdrant"
    assert main(["index", str(corpus), "-o", str(index), "--model", str(tiny_dir), "--no-lexical", "--quiet"]) == 0
    export = ["index", "export", str(index), "--qdrant", str(store), "--collection", "c", "--quiet"]
    with file_size_limit(20_000):
        assert main(export) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"bertkit: error: {store}: ") and "--resume" in line, line
    assert main([*export, "--resume"]) == 0  # the store is whole (SQLite's transactions): the export finishes
    assert "300 passages written" in capsys.readouterr().out


@pytest.fixture
def small_disk(tmp_path):
    """A 64 kB tmpfs that this process writes to: mounted in a user and mount namespace of its own (unshare -rm) by
    a helper process that holds it, and reached through that process's view of the tree, /proc/PID/root/...
    The commands run here, in this process, torch and the model loaded once (a new interpreter in the namespace
    spent seconds importing torch). Skipped where no such tmpfs can be mounted."""
    small = small_disk_works(tmp_path)
    holder = subprocess.Popen(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {small} && echo ready"
                               " && exec cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        yield Path(f"/proc/{holder.pid}/root{small}")
    finally:
        holder.stdin.close()  # cat ends, and the namespace with its tmpfs
        holder.wait(timeout=30)


def test_a_long_run_the_disk_cannot_hold_is_refused_before_the_work(tiny_dir, tmp_path, small_disk, capsys,
                                                                    monkeypatch):
    """embed and index know what they will write once they have counted the texts and cut the passages: on a disk
    without room for it (a 64 kB tmpfs) they embedded everything and only then failed on ENOSPC ("the disk is
    full"), the hour gone. Refused now before the embedding or encoding starts, in one line naming the folder,
    the bytes needed and free; a run that fits on the same disk goes on. So are per-token vectors (3 rows a text at
    least: [CLS], a token, [SEP]), which were not checked; an HNSW graph (`index add --ann hnsw`: each vector and
    its 2M level-0 links), built and then refused by the disk; and pretrain prepare's instances of a packed
    objective (each token once per pass, T - 2 at most in a T-long row), made and then refused. A trainer knows a
    checkpoint's size once it wrote the first: it warns when the ones to come (--keep-last of them, and one being
    written) will not fit."""
    import warnings

    import torch

    import bertkit.embeddings.features as features
    import bertkit.retrieval.index as index
    from bertkit.training.state import save_checkpoint

    small, said = small_disk, []
    # the long work, marked where it starts: the embedding, the encoding
    for module, name in ((features, "iter_embed"), (index, "_encode_parts")):
        def marked(*args, real=getattr(module, name), name=name, **kw):
            said.append(f"started {name}")
            return real(*args, **kw)
        monkeypatch.setattr(module, name, marked)

    def run(*argv) -> None:
        said.append(f"{argv[0]} {main([*map(str, argv), '--quiet'])}")

    for n in (600, 40):  # 600 vectors of 32 float32 are 76,800 bytes: more than the 64 kB; 40 are 5,120
        (tmp_path / "texts.txt").write_text("".join(f"sentence {i} about a cat\n" for i in range(n)))
        (tmp_path / f"corpus{n}.jsonl").write_text("".join(f'{{"_id": "d{i}", "text": "document {i}"}}\n'
                                                           for i in range(n // 2)))
        run("embed", tmp_path / "texts.txt", "-o", small / f"v{n}/v.npy", "--model", tiny_dir)
        run("index", tmp_path / f"corpus{n}.jsonl", "-o", small / f"idx{n}", "--model", tiny_dir, "--no-lexical")
        said.append(sorted(str(p.relative_to(small)) for p in small.rglob("*") if p.is_file()))
    with pytest.raises(BertkitError):  # which under torchrun rank 0 passes to every rank (an OSError left them waiting)
        index.build_index(tmp_path / "corpus600.jsonl", small / "lib", tiny_dir, lexical=None, progress=False)
    assert not (small / "lib").exists()
    for keep, values in ((1, 100), (3, 4000)):  # a checkpoint of 4,000 float32 is about 17 kB: 3 more do not fit
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            save_checkpoint(small / f"run{keep}", 1, {"w": torch.zeros(values)}, keep=keep)
        said.append(f"checkpoint {keep} {[str(w.message) for w in caught]}")
        shutil.rmtree(small / f"run{keep}")  # room for what follows
    # 200 texts: their sentence vectors (25.0 KiB) fit, their tokens' (3 x 200 x 128 bytes at least) do not
    (tmp_path / "texts.txt").write_text("".join(f"sentence {i} about a cat\n" for i in range(200)))
    run("embed", tmp_path / "texts.txt", "-o", small / "tokens.safetensors", "--model", tiny_dir, "--pooling", "none")
    run("index", "add", small / "idx40", "--ann", "hnsw", "--ann-m", 512)  # 20 x (32 + 1024) x 4 bytes
    for done in ("idx40", "v40"):  # room for the prepared data's folders (a tmpfs gives each file 4 KiB at least)
        shutil.rmtree(small / done)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "a", "mat", "."]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    (tmp_path / "books").mkdir()
    # 1,400 tokens (2.7 KiB as uint16), 10 passes: 230 rows of 64 ids and 20 masked positions at least (73.0 KiB)
    (tmp_path / "books" / "b.txt").write_text("the cat sat on a mat .\n" * 200)
    run("pretrain", "prepare", tmp_path / "books", "-o", small / "data", "--vocab", tmp_path / "vocab.txt",
        "--objective", "none", "--max-seq-length", 64, "--dupe-factor", 10)
    assert not list((small / "data").glob("instances/*/*.npy"))
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("bertkit: error: ")]
    assert said[-3:] == ["embed 2", "index 2", "pretrain 2"], said  # refused before the embedding, graph, instances
    del said[-3:]
    warned = said.pop()  # the trainers' checkpoints: a warning once the first shows the run will not fit
    assert said.pop() == "checkpoint 1 []", said
    assert re.fullmatch(rf"checkpoint 3 \['{small}/run3/checkpoints: the checkpoints still to come need about "
                        r"5\d\.\d KiB \(3 kept while one more is written, 1\d\.\d KiB each\) and its disk has "
                        r"\d\d\.\d KiB free: free some space or lower --keep-last, or the run stops when the disk is "
                        r"full'\]", warned), warned
    assert said == ["embed 2", "index 2", [],  # refused, and nothing written (not even a temporary file)
                    "started iter_embed", "embed 0", "started _encode_parts", "index 0",
                    ["idx40/index.json", "idx40/passages.jsonl", "idx40/vectors.safetensors", "v40/v.npy"]], said
    assert len(errors) == 5, errors
    # 600 x 32 x 4 bytes = 75.0 KiB; the index holds 300 passages' rows twice (its parts, then vectors.safetensors)
    assert errors[0] == (f"bertkit: error: {small}/v600: the vectors of 600 texts need at least 75.0 KiB and its "
                         "disk has 64.0 KiB free: free 11.0 KiB more, or write elsewhere"), errors[0]
    assert re.fullmatch(rf"bertkit: error: {small}/idx600: the index's passages and vectors need at least "
                        r"1\d\d\.\d KiB and its disk has \d\d\.\d KiB free: free \d+\.\d KiB more, or write elsewhere",
                        errors[1]), errors[1]
    assert errors[2].startswith(f"bertkit: error: {small}: the vectors of 200 texts need at least 75.0 KiB"), errors[2]
    assert errors[3].startswith(f"bertkit: error: {small}/idx40: the HNSW graph's vectors and links need at least "
                                "82.5 KiB"), errors[3]
    assert re.fullmatch(rf"bertkit: error: {small}/data/instances: the training instances need at least "
                        r"73\.0 KiB and its disk has \d\d\.\d KiB free: .*", errors[4]), errors[4]


def test_every_free_space_refusal_is_one_error_type_naming_the_folder_and_the_bytes(tiny_dir, tmp_path, monkeypatch,
                                                                                    capsys):
    """The refusal of a long run its disk certainly cannot hold (`bertkit.data.atomic.room_for`) was a plain OSError
    from embed, pretrain prepare, an HNSW graph and a lexical part, and a BertkitError from build_index (converted
    there for torchrun's ranks): a Python caller had to catch both. Each is a `NoSpace` now, a BertkitError that is an
    OSError, one line naming the folder and the bytes needed. The disk here says it has 1,000 bytes free."""
    import collections

    import numpy as np

    from bertkit.data import atomic
    from bertkit.data.vector_files import room_for_rows
    from bertkit.errors import NoSpace
    from bertkit.pretraining.prepare import PrepareConfig, prepare
    from bertkit.pretraining.shards import room_for_instances
    from bertkit.retrieval.ann import build_hnsw
    from bertkit.retrieval.config import LexicalOptions
    from bertkit.retrieval.index import build_index
    from bertkit.retrieval.lexical import build_lexical

    (tmp_path / "corpus.jsonl").write_text("".join(f'{{"_id": "d{i}", "text": "document {i}"}}\n' for i in range(20)))
    (tmp_path / "texts.txt").write_text("".join(f"sentence {i} about a cat\n" for i in range(50)))
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "a", "mat", "."]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "b.txt").write_text("the cat sat on a mat .\n" * 200)
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(atomic.shutil, "disk_usage", lambda folder: usage(10**9, 10**9 - 1000, 1000))
    entries = {  # what each writes, and the folder its refusal names
        "build_index": (lambda: build_index(tmp_path / "corpus.jsonl", tmp_path / "idx", tiny_dir, lexical=None,
                                            progress=False), tmp_path / "idx"),
        "build_hnsw": (lambda: build_hnsw(np.eye(40, 32, dtype=np.float32), tmp_path / "g" / "hnsw.faiss"),
                       tmp_path / "g"),
        "build_lexical": (lambda: build_lexical(tmp_path / "lex", [f"passage {i} about a cat" for i in range(50)],
                                                LexicalOptions()), tmp_path / "lex"),
        "prepare": (lambda: prepare(tmp_path / "books", tmp_path / "data", PrepareConfig(objective="none"),
                                    vocab=tmp_path / "vocab.txt", progress=False), tmp_path / "data"),
        "room_for_instances": (lambda: room_for_instances(tmp_path / "inst", 230, 64, len(words), 20),
                               tmp_path / "inst"),
        "room_for_rows": (lambda: room_for_rows(tmp_path / "v" / "v.npy", 50, 32), tmp_path / "v"),
    }
    for name, (run, folder) in entries.items():
        with pytest.raises(NoSpace) as caught:
            run()
        err, said = caught.value, str(caught.value)
        assert isinstance(err, OSError) and isinstance(err, BertkitError) and err.errno is None, name
        assert said.startswith(f"{folder}: ") and "\n" not in said, (name, said)
        assert re.search(r" need at least \d+(\.\d)? (bytes|KiB|MiB) and its disk has 1000 bytes free: ", said), said
    # the command says it in one line, as it said the OSError
    assert main(["embed", str(tmp_path / "texts.txt"), "-o", str(tmp_path / "v" / "v.npy"), "--model", str(tiny_dir),
                 "--quiet"]) == 2
    assert capsys.readouterr().err == (f"bertkit: error: {tmp_path / 'v'}: the vectors of 50 texts need at least 6.2 "
                                       "KiB and its disk has 1000 bytes free: free 5.3 KiB more, or write elsewhere\n")
