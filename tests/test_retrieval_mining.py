"""Hard-negative mining: each rule on handmade rankings, then a tiny model on a SciFact slice."""

import json

import numpy as np
import pytest

from conftest import oracle
from test_retrieval_beir import scifact_slice
from bertkit.errors import BertkitError
from bertkit.retrieval.config import MiningOptions
from bertkit.retrieval.mining import (MiningTask, columns, mine_hard_negatives, select_negatives,
                                      write_rows)

# one query; passages 0..6; passage 0 is the positive (cosine 0.80); passage 5 repeats its text
TASK = MiningTask(["the query"], ["pos", "n1", "n2", "n3", "n4", "pos", "the query"], [[0]])
RANKED_ROWS = np.array([[1, 0, 5, 6, 2, 3, 4]])
RANKED_SCORES = np.array([[0.90, 0.80, 0.80, 0.79, 0.77, 0.70, 0.50]])
POSITIVE = [np.array([0.80])]


def pick(**options):
    chosen, skipped = select_negatives(RANKED_SCORES, RANKED_ROWS, TASK, MiningOptions(**options), POSITIVE)
    return chosen[0], skipped


def test_positives_and_duplicate_texts_are_never_negatives():
    negatives, skipped = pick(num_negatives=3, relative_margin=None)
    assert negatives == [1, 2, 3]
    assert skipped["positive"] == 1 and skipped["duplicate text"] == 2  # passage 5 = a positive's text, 6 = the query


def test_relative_margin_keeps_only_candidates_clearly_below_the_positive():
    # 0.80 - 0.05 * 0.80 = 0.76: 0.90 and 0.77 are too close (likely unlabelled positives)
    negatives, skipped = pick(num_negatives=2, relative_margin=0.05)
    assert negatives == [3, 4] and skipped["relative_margin"] == 2


def test_absolute_margin_max_score_and_range_min():
    assert pick(num_negatives=1, relative_margin=None, absolute_margin=0.05)[0] == [3]  # <= 0.75
    assert pick(num_negatives=1, relative_margin=None, max_score=0.78)[0] == [2]
    assert pick(num_negatives=2, relative_margin=None, range_min=1)[0] == [2, 3]


def test_range_min_skips_the_best_candidates_that_clear_the_margin_as_sentence_transformers_does():
    """sentence-transformers' mine_hard_negatives removes the candidates the margins and max_score refuse first, then
    skips the first range_min of those left (util/hard_negatives.py: "Grab the top negative candidates and remove the
    first range_min candidates", after the margin and max_score masks). Here the margin (0.76) refuses 1 (0.90) and
    2 (0.77), so range_min 1 skips 3 (0.70) and the negative is 4. bertkit skipped 1 (which the margin refused
    anyway) and answered 3: on 200 SNLI pairs with the docs' recipe (--relative-margin 0.1 --range-min 2), 59 rows
    differed from sentence-transformers'."""
    negatives, skipped = pick(num_negatives=1, relative_margin=0.05, range_min=1)
    assert negatives == [4] and skipped["relative_margin"] == 2 and skipped["range_min"] == 1
    assert pick(num_negatives=1, relative_margin=None, max_score=0.78, range_min=1)[0] == [3]  # 1 refused, 2 skipped


def test_a_query_that_cannot_fill_its_negatives_is_left_out():
    assert pick(num_negatives=3, relative_margin=0.05)[0] is None
    assert pick(num_negatives=2, relative_margin=0.5)[0] is None  # threshold 0.40: every candidate is above it


def test_the_hardest_positive_sets_the_margin():
    task = MiningTask(["q"], ["p1", "p2", "n1", "n2"], [[0, 1]])
    chosen, _ = select_negatives(np.array([[0.9, 0.7, 0.68, 0.6]]), np.array([[0, 2, 1, 3]]), task,
                                 MiningOptions(num_negatives=1), [np.array([0.9, 0.68])])
    assert chosen == [[3]]  # 0.70 > 0.68 - 0.034: too close to the weaker positive


def test_bad_options_are_refused():
    with pytest.raises(BertkitError, match="--range-max"):
        MiningOptions(num_negatives=5, range_max=4).validate()
    with pytest.raises(BertkitError, match="at least 1"):
        MiningOptions(num_negatives=0).validate()


def test_mining_a_scifact_slice_with_a_tiny_model(shared_data, tmp_path, tiny_dir):
    import bertkit
    from bertkit.data.beir import document_text, load_beir

    folder = scifact_slice(shared_data, tmp_path / "sf", n_queries=10, n_extra=25)
    options = MiningOptions(num_negatives=2, relative_margin=0.01)
    rows, report = mine_hard_negatives(folder, str(tiny_dir), split="train", options=options)
    data = load_beir(folder, "train")
    text_of = {d: document_text(doc) for d, doc in data.corpus.items()}
    query_of = {text: q for q, text in data.queries.items()}
    assert report["rows"] == len(rows) > 0 and all(len(r) == 4 for r in rows)
    assert report["rows"] <= sum(len(d) for d in data.qrels.values())
    texts = list(dict.fromkeys([*text_of.values(), *data.queries.values()]))
    vectors = bertkit.embed(texts, str(tiny_dir), pooling="mean", normalize=True, truncate=True, max_length=64)
    vector = dict(zip(texts, vectors)).__getitem__

    for anchor, positive, *negatives in rows[:4]:
        relevant = {text_of[d] for d, s in data.qrels[query_of[anchor]].items() if s > 0}
        assert positive in relevant and not set(negatives) & relevant
        q = vector(anchor)
        floor = min(float(q @ vector(p)) for p in relevant)
        cosines = [float(q @ vector(n)) for n in negatives]
        assert cosines == sorted(cosines, reverse=True)
        assert all(c <= floor - abs(floor) * 0.01 + 1e-6 for c in cosines)
        # nothing eligible was passed over: every other passage scoring above the last negative is excluded
        for text in set(text_of.values()) - relevant - set(negatives):
            score = float(q @ vector(text))
            assert score <= cosines[-1] + 1e-6 or score > floor - abs(floor) * 0.01 - 1e-6


def test_passages_read_cut_are_counted_and_said(shared_data, tmp_path, tiny_dir, transformers_mod):
    """`bertkit mine` ranked passages past the model's max length by their first tokens, unsaid: one warning now
    counts the passages (and queries) read cut. Reference: transformers' count of each, uncut, against the tiny
    model's 64 positions."""
    from bertkit.retrieval.mining import task_from_beir

    folder = scifact_slice(shared_data, tmp_path / "sf", n_queries=4, n_extra=5)
    with open(folder / "corpus.jsonl", "a", encoding="utf-8") as f:  # beside abstracts of 100 tokens and more
        f.write('{"_id": "short", "title": "A note", "text": "Vitamin D and bones."}\n')
    task = task_from_beir(folder, "train")
    fast = transformers_mod.BertTokenizerFast.from_pretrained(str(tiny_dir))
    cut = sum(len(fast(p)["input_ids"]) > 64 for p in task.passages)
    assert 0 < cut < len(task.passages) and all(len(fast(q)["input_ids"]) <= 64 for q in task.queries)
    with pytest.warns(UserWarning, match=rf"^{cut} of {len(task.passages)} passages are longer than the 64 tokens"):
        mine_hard_negatives(folder, str(tiny_dir), split="train", options=MiningOptions(num_negatives=1))


def test_a_document_without_tokens_is_named_by_its_id(shared_data, tmp_path, tiny_dir):
    # mine stopped with "text '\u200b\u200b' yields no tokens" and no more: an invisible text, which no
    # search of a 5,000-document corpus.jsonl finds; it names the document's _id, as evaluate retrieval does
    folder = scifact_slice(shared_data, tmp_path / "sf", n_queries=3, n_extra=5)
    with open(folder / "corpus.jsonl", "a", encoding="utf-8") as f:
        f.write('{"_id": "invisible", "title": "", "text": "\\u200b\\u200b"}\n')
    with pytest.raises(BertkitError, match=r"_id 'invisible': text .* yields no tokens"):
        mine_hard_negatives(folder, str(tiny_dir), split="train", options=MiningOptions(num_negatives=1))


def test_written_rows_read_back(tmp_path):
    rows = [("a query", "its\tpassage", "neg one", "neg\ntwo")]
    write_rows(rows, tmp_path / "t.jsonl")
    assert json.loads((tmp_path / "t.jsonl").read_text(encoding="utf-8")) == dict(zip(columns(2), rows[0]))
    write_rows(rows, tmp_path / "t.tsv")
    lines = (tmp_path / "t.tsv").read_text(encoding="utf-8").split("\n")
    assert lines[0].split("\t") == ["anchor", "positive", "negative_1", "negative_2"]
    assert lines[1].split("\t") == ["a query", "its passage", "neg one", "neg two"]
    with pytest.raises(BertkitError, match=".tsv or .jsonl"):
        write_rows(rows, tmp_path / "t.csv")


def test_a_beir_setting_beside_a_pairs_file_is_refused_not_ignored(tmp_path, capsys, monkeypatch):
    """--split and --dedupe choose a BEIR folder's queries and how its repeated ids are read; beside a pairs
    file they changed nothing, silently (`bertkit mine pairs.tsv --split test` mined the same rows as without
    it). Refused before any model loads, in the library and the command; a BEIR folder still takes them."""
    from bertkit.cli import main

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("anchor\tpositive\na dog\ta puppy\na cat\ta kitten\n", encoding="utf-8")
    monkeypatch.setattr("bertkit.retrieval.mining.mine", lambda *a, **k: pytest.fail("the model ran"))
    for setting, flag in (({"split": "test"}, "--split test"), ({"dedupe": True}, "--dedupe")):
        with pytest.raises(BertkitError, match=f"^{flag} .*BEIR folder.*pairs.tsv is a pairs file"):
            mine_hard_negatives(pairs, **setting)
    for flags in (["--split", "train"], ["--dedupe"]):
        assert main(["mine", str(pairs), "-o", str(tmp_path / "m.tsv"), *flags]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"bertkit: error: {' '.join(flags)} ") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m.tsv").exists()


def coco_slice(shared_data, path, n_pairs=400):
    """The first `n_pairs` rows of the COCO caption pairs (anchor, positive, group_id: the picture)."""
    lines = (shared_data / "pairs" / "coco_captions" / "pairs_all.tsv").read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join(lines[: n_pairs + 1]) + "\n", encoding="utf-8")
    return path


def test_mining_keeps_groups_and_takes_no_negative_from_the_anchors_group(shared_data, tmp_path, tiny_dir):
    """COCO captions: a caption of the anchor's own picture is never a negative, and group_id is written.
    The picture of each caption is read from the source file (captions_val2017.tsv), not from the pairs."""
    from bertkit.cli import main

    pairs = coco_slice(shared_data, tmp_path / "coco.tsv")
    picture = {}
    for line in (shared_data / "pairs" / "coco_captions" / "captions_val2017.tsv").read_text().splitlines()[1:]:
        image, _, caption = line.split("\t")
        picture.setdefault(caption, image)
    out = tmp_path / "triplets.tsv"
    # a margin of 0: with a random tiny model, captions of one picture are no closer than others, so the
    # group rule is what keeps them out
    assert main(["mine", str(pairs), "-o", str(out), "--model", str(tiny_dir), "--num-negatives", "3",
                 "--relative-margin", "0", "--range-max", "40", "--dtype", "float32", "--quiet"]) == 0
    header, *rows = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
    negatives = ["negative_1", "negative_2", "negative_3"]
    assert header == ["anchor", "positive", *negatives, "group_id", *(f"{n}_group" for n in negatives)]
    assert len(rows) >= 100  # the queries that found 3 negatives below their positive's cosine
    for anchor, positive, *rest in rows:
        texts, (group, *groups) = rest[:3], rest[3:]
        assert picture[anchor] == picture[positive] == group
        assert all(picture[n] != group for n in texts)
        assert [picture[n] for n in texts] == groups  # each negative's picture, written for finetune embed
    # the same without group_id: the rule is off and the column is not written
    plain = tmp_path / "plain.tsv"
    plain.write_text("".join("\t".join(line.split("\t")[:2]) + "\n" for line in pairs.read_text().splitlines()))
    rows_plain, report = mine_hard_negatives(plain, str(tiny_dir), options=MiningOptions(
        num_negatives=3, relative_margin=0, range_max=40))
    assert not report["groups"] and all(len(r) == 5 for r in rows_plain)
    same = sum(picture[n] == picture[a] for a, _, *negs in rows_plain for n in negs)
    assert same > 0  # what the rule prevents: without groups, some negatives are the picture's own captions


def test_embed_batches_hold_no_two_texts_of_one_picture(shared_data, tmp_path, tiny_dir):
    """`finetune embed` on mined COCO rows: in every batch, no candidate (another row's positive or any
    negative) belongs to an anchor's picture, so no in-batch negative is a caption of the same picture."""
    from bertkit.tasks.embedding import EmbeddingBatches, read_examples

    rows, report = mine_hard_negatives(coco_slice(shared_data, tmp_path / "coco.tsv"), str(tiny_dir),
                                       options=MiningOptions(num_negatives=1, relative_margin=0, range_max=40))
    write_rows(rows, tmp_path / "mined.tsv", groups=report["groups"])
    picture = {}
    for line in (shared_data / "pairs" / "coco_captions" / "captions_val2017.tsv").read_text().splitlines()[1:]:
        image, _, caption = line.split("\t")
        picture.setdefault(caption, image)
    examples = read_examples(tmp_path / "mined.tsv", log=lambda line: None)
    assert examples.groups is not None and examples.columns == ("anchor", "positive", "negative_1")
    ids = [[[1, 2]] * 3 for _ in examples.rows]  # the sampler reads texts and groups, not tokens
    stream = EmbeddingBatches(examples, ids, batch_size=16, parts=1, seed=0)
    seen = 0
    for epoch in range(2):
        for batch in stream.batches(epoch):
            for i in batch:
                anchor_picture = picture[examples.rows[i][0]]
                for j in batch:
                    candidates = examples.rows[j][1:] if j != i else examples.rows[j][2:]
                    assert all(picture[c] != anchor_picture for c in candidates)
            seen += len(batch)
    assert seen >= 0.7 * 2 * len(examples.rows)  # rows that clash with every batch sit an epoch out


@pytest.mark.parametrize("options", [
    {"relative_margin": 0.1, "range_min": 2, "range_max": 20, "num_negatives": 3},  # the docs' recipe
    {"absolute_margin": 0.1, "max_score": 0.8, "range_max": 15, "num_negatives": 2},
])
def test_the_same_negatives_as_sentence_transformers_mine_hard_negatives(shared_data, default_model_dir, tmp_path,
                                                                         options):
    """The default model on 40 SNLI (premise, entailed hypothesis) pairs: every row's negatives, in order,
    equal those of sentence-transformers' `mine_hard_negatives` (sampling "top", n-tuples) with the same
    options (the docs say its recipes carry over)."""
    st_util = oracle("sentence_transformers.util", "sentence-transformers")
    datasets = oracle("datasets", "datasets")
    st = oracle("sentence_transformers", "sentence-transformers").SentenceTransformer(str(default_model_dir),
                                                                                      device="cpu")
    lines = (shared_data / "pairs" / "snli_devtest" / "pairs_entailment.tsv").read_text(encoding="utf-8").split("\n")
    pairs = [line.split("\t") for line in lines[1:41]]
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join(lines[:41]) + "\n", encoding="utf-8")
    theirs = st_util.mine_hard_negatives(
        datasets.Dataset.from_dict({"anchor": [a for a, _ in pairs], "positive": [p for _, p in pairs]}), st,
        output_format="n-tuple", sampling_strategy="top", verbose=False, **options)
    ours, _ = mine_hard_negatives(path, str(default_model_dir), options=MiningOptions(**{"relative_margin": None,
                                                                                        **options}))
    n = options["num_negatives"]
    expected = {(r["anchor"], r["positive"]): tuple(r[f"negative_{i}"] for i in range(1, n + 1)) for r in theirs}
    assert len(expected) > 30
    assert {(r[0], r[1]): tuple(r[2:]) for r in ours} == expected
