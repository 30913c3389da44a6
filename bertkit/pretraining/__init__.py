"""Pre-training: from raw text to masked instances, and the training loop.

Data (issue 4), one module per concept, in pipeline order:
    sentences  split free text into sentences
    corpus     read files/folders/.gz into documents of sentences, counting what is skipped
    shards     tokenise once into compact numpy shards (both cores, atomic, resumable)
    instances  pairs of spans (NSP / SOP) or packed sequences, as create_pretraining_data
    masking    15% / 80-10-10 masking: token, whole-word, n-gram
    prepare    the `bertkit pretrain prepare` job
    dataset    PretrainingDataset: the prepared instances, seeded and seekable
    collate    PretrainingCollator: padded batches, dynamic masking
"""
