"""Small evaluation tasks built from held-out TinyStories text, in lm-evaluation-harness's YAML
task format over local JSONL data, so that ``lm_eval`` runs them offline.

``story_endings`` (``multiple_choice``, metrics ``acc`` and ``acc_norm``): the start of a story
(two or more sentences) and its true next sentence among sentences taken from other stories;
lm-eval scores each choice by its summed log-likelihood (loglikelihood requests).

``story_continuation`` (``generate_until``, metric ``exact_match``): a story cut before a word;
the model continues it greedily and its first word must be that word (case ignored). It makes
lm-eval send generation requests; ``exact_match`` needs no download.

:func:`write_local_tasks` writes, into one folder::

    story_endings.jsonl  story_endings.yaml  story_continuation.jsonl  story_continuation.yaml
    datasets-cache/      where ``datasets`` keeps its Arrow copy of the JSONL files

The YAML files name their data by absolute path, so pass the folder to lm-eval where it was
built (``TaskManager(include_path=folder)``, or ``lm_eval --include_path folder``). The same text
and seed always give the same files.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from headwise.config import atomic_write_text
from headwise.errors import HeadwiseError

STORY_ENDINGS = "story_endings"
STORY_CONTINUATION = "story_continuation"
#: the tasks this module builds, by lm-eval task name
LOCAL_TASKS = (STORY_ENDINGS, STORY_CONTINUATION)
DATASETS_CACHE = "datasets-cache"

# A sentence: from a non-space character to the first run of . ! ? (and a closing quote) that
# is followed by whitespace or the end. Good enough for TinyStories' simple prose.
_SENTENCE = re.compile(r"\S.*?[.!?]+[\"'”’]?(?=\s|$)", re.S)
# Stories (and paragraphs within them) are separated by blank lines in the stream samples.
_PARAGRAPH = re.compile(r"\n\s*\n")
# A word the continuation task may ask for: letters only, after a space.
_NEXT_WORD = re.compile(r" ([A-Za-z]+)\b")


@dataclass(frozen=True)
class LocalTaskSizes:
    """How many examples each task gets and how they look."""

    #: examples per task (fewer when the text has too few passages)
    examples: int = 200
    #: wrong endings per story_endings example
    distractors: int = 3
    #: longest context in characters (the model's context is short: 128 tokens is ~500 characters)
    max_context_chars: int = 320
    #: fewest words before the word a story_continuation example asks for
    min_prefix_words: int = 8


def passages(texts: Iterable[str]) -> Iterator[list[str]]:
    """The sentences of each paragraph of ``texts`` that has at least three, whitespace inside
    each sentence collapsed to single spaces."""
    for text in texts:
        for paragraph in _PARAGRAPH.split(text):
            sentences = [" ".join(s.split()) for s in _SENTENCE.findall(paragraph)]
            if len(sentences) >= 3:
                yield sentences


def _context(sentences: list[str], end: int, max_chars: int) -> str | None:
    """The sentences before ``end``, as many of the last ones as fit in ``max_chars`` (at least
    two), or None when two do not fit."""
    chosen: list[str] = []
    for sentence in reversed(sentences[:end]):
        if len(" ".join([sentence, *chosen])) > max_chars:
            break
        chosen.insert(0, sentence)
    return " ".join(chosen) if len(chosen) >= 2 else None


def story_ending_examples(pool: list[list[str]], sizes: LocalTaskSizes, rng: random.Random,
                          fits: Callable[[str], bool] | None = None) -> list[dict]:
    """``{"context", "choices", "label"}`` examples: a story's start, its true next sentence and
    ``sizes.distractors`` sentences from other passages, in a random order. ``fits``: whether an
    ending fits the model (lm-eval cannot score an ending longer than the model's context); the
    endings it refuses are left out."""
    examples = []
    for i in rng.sample(range(len(pool)), len(pool)):
        sentences = pool[i]
        end = rng.randrange(2, len(sentences))
        context = _context(sentences, end, sizes.max_context_chars)
        if context is None:
            continue
        true = sentences[end]
        if fits is not None and not fits(true):
            continue
        wrong: list[str] = []
        # bounded, so that a text repeating the same few sentences ends instead of looping
        for _ in range(100 * sizes.distractors):
            j = rng.randrange(len(pool))
            candidate = rng.choice(pool[j])
            if j != i and candidate != true and candidate not in wrong and (fits is None or fits(candidate)):
                wrong.append(candidate)
                if len(wrong) == sizes.distractors:
                    break
        if len(wrong) < sizes.distractors:
            continue
        choices = [true, *wrong]
        rng.shuffle(choices)
        examples.append({"context": context, "choices": choices, "label": choices.index(true)})
        if len(examples) == sizes.examples:
            break
    return examples


def continuation_examples(pool: list[list[str]], sizes: LocalTaskSizes, rng: random.Random) -> list[dict]:
    """``{"context", "target"}`` examples: a story cut just before a word (the context ends
    without the space before it) and that word."""
    examples = []
    for i in rng.sample(range(len(pool)), len(pool)):
        text = " ".join(pool[i])
        cuts = [m for m in _NEXT_WORD.finditer(text)
                if len(text[:m.start()].split()) >= sizes.min_prefix_words and m.start() <= sizes.max_context_chars]
        if not cuts:
            continue
        cut = rng.choice(cuts)
        examples.append({"context": text[:cut.start()], "target": cut.group(1)})
        if len(examples) == sizes.examples:
            break
    return examples


def _task_yaml(name: str, data: Path, cache: Path, fields: dict) -> dict:
    return {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data)}, "cache_dir": str(cache)},
        "test_split": "test",
        **fields,
        "metadata": {"version": 1.0, "built_by": "headwise.hf.evaluation.local_tasks"},
    }


_ENDINGS_FIELDS = {
    "output_type": "multiple_choice",
    "doc_to_text": "context",
    "doc_to_choice": "choices",
    "doc_to_target": "label",
    "metric_list": [
        {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
        {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
    ],
}

_CONTINUATION_FIELDS = {
    "output_type": "generate_until",
    "doc_to_text": "context",
    "doc_to_target": "target",
    "generation_kwargs": {"until": ["\n"], "max_gen_toks": 8, "do_sample": False, "temperature": 0.0},
    # The model's first word is the answer (it starts with a space and goes on after the word).
    "filter_list": [{"name": "first_word", "filter": [
        {"function": "regex", "regex_pattern": r"([A-Za-z]+)", "group_select": 0, "fallback": ""},
        {"function": "take_first"},
    ]}],
    "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True,
                     "ignore_case": True}],
}


def local_task_examples(texts: Iterable[str], sizes: LocalTaskSizes = LocalTaskSizes(), seed: int = 0,
                        max_passages: int = 5000, fits: Callable[[str], bool] | None = None) -> dict[str, list[dict]]:
    """The examples of each local task (by name) built from held-out ``texts``, from at most
    ``max_passages`` of its paragraphs; ``fits`` as in :func:`story_ending_examples`. Writes
    nothing. Deterministic in (``texts``, ``sizes``, ``seed``), and in ``fits`` when it refuses
    an ending."""
    pool = list(itertools.islice(passages(texts), max_passages))
    if len(pool) < sizes.distractors + 2:
        raise HeadwiseError(f"the held-out text has only {len(pool)} paragraphs of three or more sentences: "
                            f"too few to build {', '.join(LOCAL_TASKS)} (give a longer text)")
    return {STORY_ENDINGS: story_ending_examples(pool, sizes, random.Random(f"{seed}:endings"), fits),
            STORY_CONTINUATION: continuation_examples(pool, sizes, random.Random(f"{seed}:continuation"))}


def write_local_tasks(built: dict[str, list[dict]], out_dir: str | Path) -> Path:
    """Write the local tasks' examples (:func:`local_task_examples`) and their YAML into
    ``out_dir``; returns ``out_dir``."""
    import yaml

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fields_of = {STORY_ENDINGS: _ENDINGS_FIELDS, STORY_CONTINUATION: _CONTINUATION_FIELDS}
    for name, examples in built.items():
        fields = fields_of[name]
        data = out / f"{name}.jsonl"
        atomic_write_text(data, "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in examples))
        spec = _task_yaml(name, data.resolve(), (out / DATASETS_CACHE).resolve(), fields)
        atomic_write_text(out / f"{name}.yaml", yaml.safe_dump(spec, sort_keys=False, allow_unicode=True))
    return out


def read_examples(task_dir: str | Path, name: str) -> list[dict]:
    """The examples of local task ``name`` in a folder written by :func:`write_local_tasks`."""
    path = Path(task_dir) / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def held_out_texts(run_dir: str | Path) -> Iterator[str]:
    """The validation documents of a language run (its ``[task]``'s separate validation data or
    hold-out), which its model never trained on."""
    from headwise.train.generate import run_config

    cfg = run_config(Path(run_dir))
    texts = cfg.task.held_out_texts()
    if texts is None:
        raise HeadwiseError(f"{run_dir} trained on the {cfg.task.kind!r} task: it has no held-out text")
    return texts


def file_texts(path: str | Path) -> Iterator[str]:
    """The documents of a text file (stories separated by ``<|endoftext|>`` lines, one stream,
    or JSONL), read as a run's data source is."""
    from headwise.data.sources import open_source

    return open_source(str(path)).documents()
