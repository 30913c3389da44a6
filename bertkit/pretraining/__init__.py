"""Pre-training: from raw text to masked instances, and pre-training's side of the training loop.

Data, one module per concept, in pipeline order (the raw text is read into documents of sentences
by `bertkit.data.corpus` and `bertkit.data.sentences`):
    shards.py      tokenise once into compact numpy shards (both cores, atomic, resumable)
    held_out.py    the held-out slice: whole documents, never trained on
    instances.py   pairs of spans (NSP / SOP) or packed sequences, as create_pretraining_data
    masking.py     15% / 80-10-10 masking: token, whole-word, n-gram
    blocks.py      instance blocks, the unit of prepare's instance stage
    prepare.py     the `bertkit pretrain prepare` job
    dataset.py     PretrainingDataset: the prepared instances, seeded and seekable
    collate.py     PretrainingCollator: padded batches, dynamic masking
Training:
    run_config.py  the settings of one run (a typed dataclass)
    train.py       masked LM (+ NSP / SOP) or ELECTRA on the prepared data, around bertkit.training's loop
"""
