"""The offline GLUE stand-ins, two tasks built from held-out TinyStories text (by default the lm
family's validation sample, which a masked-LM run only evaluates on), so they run without the
network:

- ``standin`` (a pair task, as MRPC or RTE): does sentence B follow sentence A in the same passage?
- ``standin_order`` (a single-sentence task, as CoLA): is the sentence as written, or were its
  inner words shuffled? Both versions hold the same words, so the label is in the order alone.

Both are built as follows:

1. Passages: the source's documents when it has several (stories separated by
   ``<|endoftext|>``); a single text stream (the validation sample, whose story boundaries cannot
   be recovered) is cut into paragraphs at blank lines. Each passage is split into sentences
   after ``.``, ``!`` or ``?`` followed by whitespace; passages of fewer than 2 sentences are
   dropped.
2. Split by passage: the passages in their order, the first ``1 - eval_frac`` of them for
   training and the rest for evaluation, with a gap of :data:`GUARD` passages dropped between
   them when they are paragraphs (so that a story of up to that many paragraphs cannot reach
   both splits); no passage is in both.
3. Examples of ``standin``: in each passage one position ``i`` is drawn uniformly (seeded) among
   ``0 .. n - 2``; it gives a positive ``(s_i, s_{i+1})`` (label 1) and a negative
   ``(s_i, t_{i+1})`` (label 0), where ``t`` is another passage of the SAME split that has a
   sentence at ``i + 1`` (the same position), chosen among :data:`CANDIDATES` such passages drawn
   at random as the one whose sentence ``i + 1`` is closest in length (characters) to ``s_{i+1}``.
   So labels are exactly balanced, A is shared by both labels, and B's position and length carry
   almost no cue: telling them apart needs the two sentences understood together.
   Examples of ``standin_order``: every sentence of a split's passages with at
   least :data:`MIN_ORDER_WORDS` words is used once: a seeded half of them as written (label 1),
   the others with their words but the first and the last in a seeded random order that differs
   from the written one (label 0; the capital and the full stop stay where they were; a sentence
   whose inner words are all one word stays as written, label 1). The two labels are within one
   sentence of balanced, apart from those few.
4. Each split's examples are shuffled by the seed. The same source, seed and fraction give the
   same examples.
"""

from __future__ import annotations

import re

import numpy as np

from headwise.data.sources import open_source
from headwise.errors import HeadwiseError

#: the stand-in's metrics (names of :data:`headwise.families.encoder.metrics.METRICS`)
STANDIN_METRICS = ("accuracy", "f1", "matthews_correlation")
#: paragraphs dropped between the training and evaluation passages of a text stream
GUARD = 20
#: passages a negative's sentence is chosen among (the closest in length)
CANDIDATES = 8
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"'])\s+")

Examples = tuple[tuple[list[str], list[str]], np.ndarray]
OrderExamples = tuple[tuple[list[str]], np.ndarray]
#: the shortest sentence (in words) the word-order stand-in uses: a shuffle needs two inner words
MIN_ORDER_WORDS = 4


def sentences(text: str) -> list[str]:
    """The sentences of a passage (split after ., ! or ?, a closing quote kept with its sentence)."""
    parts = _SENTENCE_END.split(text.strip())
    return [p.strip() for p in parts if p.strip()]


def passages(source: str) -> tuple[list[list[str]], bool]:
    """The passages of ``source`` as sentence lists, and whether they are paragraphs of a stream."""
    docs = list(open_source(source).documents())
    stream = len(docs) == 1
    units = re.split(r"\n\s*\n", docs[0]) if stream else docs
    return [s for s in (sentences(u) for u in units) if len(s) >= 2], stream


def _examples(split: list[list[str]], rng: np.random.Generator) -> Examples:
    a_texts, b_texts, labels = [], [], []
    for k, sents in enumerate(split):
        i = int(rng.integers(0, len(sents) - 1))
        others = [j for j in range(len(split)) if j != k and len(split[j]) > i + 1 and split[j][i + 1] != sents[i + 1]]
        if not others:
            continue
        picks = rng.choice(len(others), size=min(CANDIDATES, len(others)), replace=False)
        target = len(sents[i + 1])
        negative = min((split[others[p]][i + 1] for p in picks), key=lambda s: abs(len(s) - target))
        a_texts += [sents[i], sents[i]]
        b_texts += [sents[i + 1], negative]
        labels += [1, 0]
    order = rng.permutation(len(labels))
    return ([a_texts[o] for o in order], [b_texts[o] for o in order]), np.asarray(labels, dtype=np.int64)[order]


def split_passages(source: str, eval_frac: float) -> tuple[list[list[str]], list[list[str]]]:
    """The training and evaluation passages of ``source`` (steps 1 and 2 of the module docstring)."""
    units, stream = passages(source)
    n_eval = round(eval_frac * len(units))
    gap = GUARD if stream else 0
    train, evaluation = units[:len(units) - n_eval - gap], units[len(units) - n_eval:]
    if len(train) < 2 or len(evaluation) < 2:
        raise HeadwiseError(f"the stand-in source {source} has {len(units)} passages of 2 or more sentences, too few "
                            f"for training and evaluation passages{f' {gap} apart' if gap else ''}: give more text")
    return train, evaluation


def standin_splits(source: str, seed: int = 0, eval_frac: float = 0.2) -> tuple[Examples, Examples]:
    """``(train, eval)`` of the next-sentence stand-in built from ``source`` (see the module
    docstring), each ``((sentences_a, sentences_b), labels)``."""
    train, evaluation = split_passages(source, eval_frac)
    rng = np.random.default_rng([seed, 0x5741])
    return _examples(train, rng), _examples(evaluation, rng)


def _shuffled(words: list[str], rng: np.random.Generator) -> list[str] | None:
    """``words`` with every word but the first and the last (which carry the capital and the full
    stop) in a seeded random order that changes the text; None where no order does."""
    inner = words[1:-1]
    if len(set(inner)) < 2:
        return None
    while True:
        order = [inner[i] for i in rng.permutation(len(inner))]
        if order != inner:
            return [words[0], *order, words[-1]]


def _order_examples(split: list[list[str]], rng: np.random.Generator) -> OrderExamples:
    texts, labels = [], []
    candidates = [s.split() for sents in split for s in sents]
    candidates = [w for w in candidates if len(w) >= MIN_ORDER_WORDS]
    keep = rng.permutation(len(candidates)) < (len(candidates) + 1) // 2  # half keep their order
    for words, original in zip(candidates, keep):
        swapped = None if original else _shuffled(words, rng)
        texts.append(" ".join(words if swapped is None else swapped))
        labels.append(1 if swapped is None else 0)
    order = rng.permutation(len(labels))
    return ([texts[o] for o in order],), np.asarray(labels, dtype=np.int64)[order]


def order_splits(source: str, seed: int = 0, eval_frac: float = 0.2) -> tuple[OrderExamples, OrderExamples]:
    """``(train, eval)`` of the word-order stand-in built from ``source`` (see the module
    docstring), each ``((sentences,), labels)``: 1 for a sentence as written, 0 for one whose inner
    words were shuffled."""
    train, evaluation = split_passages(source, eval_frac)
    rng = np.random.default_rng([seed, 0x0DE5])
    return _order_examples(train, rng), _order_examples(evaluation, rng)
