"""Evaluation of trained language runs with lm-evaluation-harness (the optional ``eval`` extra).

:mod:`~headwise.hf.evaluation.local_tasks` builds small offline tasks from held-out TinyStories
text; :mod:`~headwise.hf.evaluation.harness` runs lm-eval tasks (those, or lm-eval's standard ones)
on a ``transformers`` model and writes the scores to a JSON file.
"""
