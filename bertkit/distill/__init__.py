"""Distillation: a sentence model made smaller (a static table, fewer layers)."""
