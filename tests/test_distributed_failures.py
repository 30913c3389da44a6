"""Under torchrun every rank either finishes or stops with one line: what went wrong on another rank, or a command
that is not written for several processes.

* A rank whose peer died (SIGKILL, an out-of-memory kill) fails in its next collective: gloo raised a RuntimeError
  ("Connection reset by peer") and the survivor printed a 40-line traceback beside torchrun's own report. Two ranks
  are started here as torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR/PORT), without torchrun, so that nothing
  stops the survivor before it speaks; rank 1 kills itself after joining the group.
* A command that runs in one process (`pretrain prepare`, `embed`, `distill static`) was run by each rank, all
  writing the same files: `pretrain prepare` stopped on one rank with "No such file or directory:
  'prep/tokens/00002/stats.json'" (the other rank's half-written folder), `distill static` with a traceback
  (OSError: Directory not empty), `index export` with portalocker's traceback (the other rank held the Qdrant
  folder). It is refused on every rank, before anything is read or written.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from bertkit.cli import main
from test_distributed import free_port

# rank 1 dies by SIGKILL once both ranks are in the group; rank 0 goes on with collectives
PEER_DIES = textwrap.dedent("""
    import os, signal, sys
    import torch
    import torch.distributed as dist
    from bertkit.errors import BertkitError
    from bertkit.training import distributed

    try:
        with distributed.process_group("cpu") as info:
            distributed.barrier(info)
            if info.rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            for _ in range(10_000):
                dist.all_reduce(torch.ones(4))
    except BertkitError as err:
        print(f"bertkit: error: {err}", file=sys.stderr)
        sys.exit(2)
""")


def test_a_rank_whose_peer_died_stops_with_one_line_not_a_traceback(tmp_path):
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(subprocess.Popen([sys.executable, "-c", PEER_DIES], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    try:
        out, err = procs[0].communicate(timeout=120)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert procs[1].returncode == -9  # the peer really died
    lines = err.strip().splitlines()
    assert procs[0].returncode == 2, err[-3000:]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "another process of this torchrun run" in lines[0] and "--resume" in lines[0]


@pytest.mark.parametrize("command", [("pretrain", "prepare", "CORPUS", "-o", "OUT"),
                                     ("embed", "CORPUS/a.txt", "-o", "OUT/v.npy"),
                                     ("distill", "static", "-o", "OUT"),
                                     ("index", "add", "OUT", "--ann", "hnsw"),  # `index` builds under torchrun,
                                     ("index", "export", "OUT", "--qdrant", "OUT/q", "--collection", "c")])  # not these
def test_a_one_process_command_is_refused_on_every_rank(tmp_path, monkeypatch, capsys, command):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("One line of text.\nAnother one.\n", encoding="utf-8")
    out = tmp_path / "out"
    argv = [str(a).replace("CORPUS", str(corpus)).replace("OUT", str(out)) for a in command]
    for rank in ("0", "1"):  # as torchrun --nproc_per_node 2 starts them
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "runs in one process" in err[0] and "without torchrun" in err[0], err
        assert not out.exists()


def test_an_error_on_rank_0_is_raised_on_every_rank_as_the_error_it_is(monkeypatch):
    """`distributed.on_rank_0` (build_index's folder and its free-space check under torchrun) raised rank 0's
    BertkitError on every rank as a plain BertkitError made from its message: the free-space refusal, a NoSpace and
    so an OSError too, was one alone and an OSError under torchrun not. The ranks are simulated here: the broadcast
    is a pickle round trip, as torch.distributed.broadcast_object_list makes it."""
    import pickle

    from bertkit.errors import BertkitError, NoSpace
    from bertkit.training import distributed

    sent = []

    def broadcast(obj, info, src=0):
        if info.rank == src:
            sent.append(pickle.dumps(obj))
        return pickle.loads(sent[-1])

    monkeypatch.setattr(distributed, "broadcast_object", broadcast)
    said = "out: the index's passages and vectors need at least 1.0 KiB and its disk has 10 bytes free"
    for error in (NoSpace(said), BertkitError("out holds an index: --overwrite or --resume")):
        def step(error=error):
            raise error
        for rank in (0, 1):  # rank 0 runs the step, rank 1 waits for its outcome
            with pytest.raises(BertkitError) as caught:
                distributed.on_rank_0(distributed.DistInfo(rank=rank, world_size=2), step)
            assert type(caught.value) is type(error) and str(caught.value) == str(error), rank
    for rank in (0, 1):  # a step that succeeds: nothing on either rank
        assert distributed.on_rank_0(distributed.DistInfo(rank=rank, world_size=2), lambda: None) is None
