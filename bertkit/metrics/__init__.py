"""Scores against references: the fine-tuning tasks' metrics (accuracy, F1, entity F1, SQuAD EM/F1, Pearson/Spearman) and the IR metrics of retrieval (nDCG, MRR, MAP, recall). Pure Python."""
