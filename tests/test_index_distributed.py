"""`torchrun --nproc_per_node 2 -m bertkit.cli index`: two gloo ranks on the CPU build the index one process builds.

The tiny model and the 12 SciFact abstracts of tests/test_index.py, cut into passages of 32
tokens and saved in parts of 16 passages (about ten parts, dealt to the two ranks). The
reference is `build_index` in this process. Two ranks must write the same passages.jsonl
and index.json (bytes) and the same vectors within 1e-5 (each rank runs one thread, this
process two: the sums are taken in another order). A rank killed with SIGKILL mid-way
leaves its finished parts; started again without `--resume`, both ranks refuse in one line;
`--resume` by one process keeps every part on disk, whichever rank wrote it, and encodes the rest.
"""

import logging
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from bertkit.cli import main
from bertkit.retrieval.index import build_index, map_safetensors
from bertkit.training.distributed import DistInfo, deal
from test_distributed import free_port
from test_index import OVERLAP, TOKENS, make_tiny, scifact_corpus

PART = 16
FILES = ("index.json", "lexical", "passages.jsonl", "vectors.safetensors")  # lexical/: the BM25 part

# bertkit.cli that prints "rank R wrote part-P" for every part it renames into place, and whose rank 1
# dies by SIGKILL when its KILL_RANK1_AT-th part is in its temporary file, before the rename
KILLABLE = textwrap.dedent("""
    import os, signal, sys
    rank, kill_at, real_replace, mine = os.environ["RANK"], int(os.environ.get("KILL_RANK1_AT", 0)), os.replace, []

    def replace(src, dst):
        if str(dst).endswith(".npy"):
            mine.append(dst)
            if rank == "1" and len(mine) == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            real_replace(src, dst)
            print(f"rank {rank} wrote {os.path.basename(dst)}", flush=True)
            return
        return real_replace(src, dst)

    os.replace = replace
    from bertkit.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def torchrun(nproc, target, *args, env=None, timeout=120):
    """torchrun on this machine (as tests/test_distributed.py launches it); returns the finished process."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *target, *map(str, args)]
    return subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def setup(shared_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("index_ranks")
    tiny, corpus = make_tiny(tmp / "tiny"), scifact_corpus(shared_data, tmp / "corpus.jsonl")
    alone = tmp / "alone"
    info = build_index(corpus, alone, str(tiny), passage_tokens=TOKENS, overlap=OVERLAP, batch_size=8,
                       part_size=PART, dtype="float32", progress=False)
    args = ["index", corpus, "--model", tiny, "--passage-tokens", TOKENS, "--overlap", OVERLAP, "--batch-size", 8,
            "--part-size", PART, "--dtype", "float32", "--device", "cpu"]
    return args, alone, info


def assert_same_index(got, want):
    for name in ("index.json", "passages.jsonl"):
        assert (got / name).read_bytes() == (want / name).read_bytes(), name
    a, b = map_safetensors(got / "vectors.safetensors"), map_safetensors(want / "vectors.safetensors")
    assert a.keys() == b.keys() and a["vectors"].shape == b["vectors"].shape
    np.testing.assert_array_equal(a["document"], b["document"])
    np.testing.assert_array_equal(a["passage_offset"], b["passage_offset"])
    np.testing.assert_allclose(a["vectors"], b["vectors"], atol=1e-5, rtol=0)
    assert sorted(os.listdir(got)) == sorted(FILES)  # no parts, no build.json left behind
    lexical = sorted(os.listdir(want / "lexical"))
    assert sorted(os.listdir(got / "lexical")) == lexical and lexical  # the BM25 part, built once over all passages
    for name in lexical:
        assert (got / "lexical" / name).read_bytes() == (want / "lexical" / name).read_bytes(), name


def test_parts_are_dealt_back_and_forth_so_rising_costs_balance():
    def shares(n, world):
        return [deal(n, DistInfo(rank=r, world_size=world)) for r in range(world)]

    for world in (1, 2, 3, 4, 8):
        for n in range(0, 60):
            got = shares(n, world)
            assert sorted(i for s in got for i in s) == list(range(n))  # every part once
            assert all(s == sorted(s) for s in got)
            # part i costing i (costs rising evenly): totals at most W-1 apart (round-robin: about n/2 for 2 ranks)
            totals = [sum(s) for s in got]
            assert max(totals) - min(totals) <= world - 1, (world, n)
    assert shares(8, 2) == [[0, 3, 4, 7], [1, 2, 5, 6]]
    assert shares(9, 3) == [[2, 3, 8], [1, 4, 7], [0, 5, 6]]  # the dearest three go to ranks 0, 1, 2
    rng = np.random.default_rng(0)
    for _ in range(300):  # any rising costs: at most the dearest part's cost apart
        world, n = int(rng.integers(2, 5)), int(rng.integers(1, 40))
        cost = np.sort(rng.random(n))
        totals = [cost[s].sum() for s in shares(n, world)]
        assert max(totals) - min(totals) <= cost[-1] + 1e-12


@pytest.mark.slow
def test_two_ranks_build_the_index_one_process_builds(setup, tmp_path):
    args, alone, info = setup
    assert info["passages"] > 8 * PART  # enough parts for both ranks
    res = torchrun(2, ["-m", "bertkit.cli"], *args, "-o", tmp_path / "two")
    assert res.returncode == 0, res.stderr[-4000:]
    assert_same_index(tmp_path / "two", alone)
    # one summary line (rank 0's) and one progress bar (rank 0's share)
    assert res.stdout.count(" passages of ") == 1 and f"{info['passages']} passages of 12 documents" in res.stdout
    assert "rank 0's share of 2 ranks" in res.stderr


@pytest.mark.slow
def test_a_rank_killed_mid_way_keeps_its_parts_and_resume_finishes_the_same_index(setup, tmp_path, caplog):
    args, alone, info = setup
    out = tmp_path / "index"
    n_parts = -(-info["passages"] // PART)
    share = {r: {f"part-{p:05d}.npy" for p in deal(n_parts, DistInfo(rank=r, world_size=2))} for r in (0, 1)}
    first, second = sorted(share[1])[:2]  # rank 1's parts, in the order it encodes them
    script = tmp_path / "killable_cli.py"
    script.write_text(KILLABLE)

    killed = torchrun(2, [script], *args, "-o", out, "--quiet", env={"KILL_RANK1_AT": "2"})
    assert killed.returncode != 0, killed.stderr[-4000:]
    wrote = re.findall(r"rank (\d) wrote (part-\d+\.npy)", killed.stdout)
    assert ("1", first) in wrote and all(part in share[int(r)] for r, part in wrote), (killed.stdout, share)
    on_disk = {p for p in os.listdir(out / "parts") if p.endswith(".npy")}
    assert {part for _, part in wrote} <= on_disk and on_disk & share[1] == {first}, (on_disk, wrote, share)
    assert (out / "parts" / (second + ".tmp")).is_file()  # rank 1's second part, never renamed
    assert not (out / "index.json").exists()

    # started again without --resume: refused in one line, and no rank is left waiting at a barrier for rank 0
    # (which gloo ends with a "[rank1]: Traceback ... Connection closed by peer"); rank 1 refuses too, unless
    # torchrun stops it first, on rank 0's exit
    refused = torchrun(2, ["-m", "bertkit.cli"], *args, "-o", out, "--quiet")
    assert refused.returncode != 0 and "holds an unfinished index: add --resume" in refused.stderr, refused.stderr
    assert not re.search(r"\[rank\d\]:.*(Traceback|Error)", refused.stderr), refused.stderr[-4000:]

    # resumed by one process (the parts are named by number, not by rank): it encodes only the missing parts
    with caplog.at_level(logging.INFO, logger="bertkit.retrieval.index"):
        assert main([*map(str, args), "-o", str(out), "--resume", "--quiet"]) == 0
    assert_same_index(out, alone)
    done = re.findall(r"rank 0 of 1: encoded (\d+) passages \((\d+) parts\).*; (\d+) of its parts were on disk",
                      caplog.text)
    assert [(int(k), int(m)) for _, k, m in done] == [(n_parts - len(on_disk), len(on_disk))]
