"""What to tokenize: the source, the subset, the held-out validation set and the tokenizer.

:class:`DataConfig` is the user's request (also the data half of a language task's config);
:func:`plan_data` checks it against the files and gives a :class:`DataPlan`, which yields the
training and validation documents.

Subsets and hold-outs are decided by story index with a seed, so they are the same on every
machine and every pass: story ``i`` is held out when a uniform draw from
``default_rng([seed, 1, i // 65536])`` (position ``i % 65536``) falls below the fraction; a
random subset of K picks K of the remaining indices with ``default_rng([seed, 2])``.

``"fraction:F:K/N"`` validates on the K-th of N equal bands of those draws and trains on none of
the F: runs that select (a tuning run on part 2/2) and runs that report (part 1/2) then train on
the same stories, and neither's validation stories are in the other's.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any, Iterator, Literal

import numpy as np
from pydantic import Field, ValidationInfo, field_validator

from headwise.config import Config
from headwise.data.sources import Source, hub_splits, open_source
from headwise.errors import HeadwiseError
from headwise.text.tokenizer import parse_tokenizer_spec

#: Fraction of stories held out when the source has no validation split of its own.
DEFAULT_HOLDOUT = 0.05
_BLOCK = 1 << 16


class DataConfig(Config):
    """Which text to tokenize and how (the ``[task]`` fields of a language task that pick data)."""

    #: a local file or folder (relative paths are also looked up under HEADWISE_DATA), or a hub
    #: dataset name such as "roneneldan/TinyStories" or "skeskinen/TinyStories-GPT4"
    source: str = "roneneldan/TinyStories"
    #: auto (from the file name and contents), stories, stream, jsonl, parquet or hub
    format: Literal["auto", "stories", "stream", "jsonl", "parquet", "hub"] = "auto"
    #: the text field of jsonl, parquet and hub data (default: "text", else "story")
    field: str | None = None
    #: the hub split to train on
    split: str = "train"
    #: "gpt-neo" (GPT-2's 50,257-token BPE) or "bpe:N" (a byte-level BPE of N tokens trained here;
    #: refused when the training text cannot fill N, with the number it supports)
    tokenizer: str = "gpt-neo"
    #: use only K training stories
    subset: int | None = Field(default=None, gt=0)
    #: the first K stories, or K chosen at random with the seed
    subset_order: Literal["first", "random"] = "first"
    #: "auto" (the source's "validation" split, else a 5% hold-out), "split:NAME",
    #: "fraction:F" (a seeded hold-out of stories), "fraction:F:K/N" (the K-th of N equal parts of
    #: that hold-out; training still leaves out all of F), or a path / hub name of separate data
    validation: str = "auto"
    #: seed of the random subset and of the hold-out
    seed: int = 0
    #: where caches live (default: $HEADWISE_CACHE, else ~/.cache/headwise)
    cache_dir: str | None = None

    @field_validator("validation", mode="before")
    @classmethod
    def _number_is_a_fraction(cls, value: Any) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):  # the likeliest slip
            raise ValueError(f"a number is not a validation spec: a seeded hold-out of that share of the "
                             f"stories is written 'fraction:{value}'")
        return value

    @field_validator("tokenizer", "validation")
    @classmethod
    def _check_spec(cls, value: str, info: ValidationInfo) -> str:
        parse = parse_tokenizer_spec if info.field_name == "tokenizer" else parse_validation
        try:
            parse(value)
        except HeadwiseError as exc:  # as pydantic's error, so the message names the field
            raise ValueError(str(exc)) from None
        return value

    def data_fields(self) -> dict[str, Any]:
        """Only the fields of :class:`DataConfig` (a task config subclass adds others)."""
        return {name: getattr(self, name) for name in DataConfig.model_fields}


@dataclass(frozen=True)
class Holdout:
    """A seeded hold-out of stories: the ``fraction`` of them training never sees, of which part
    ``part`` of ``parts`` (equal bands of the stories' draws) is the validation set."""

    fraction: float
    part: int = 1
    parts: int = 1

    def role(self, draw: float) -> str | None:
        """``"train"``, ``"valid"`` or None (held out, but in another part) for a story's draw."""
        if draw >= self.fraction:
            return "train"
        band = self.fraction / self.parts
        return "valid" if (self.part - 1) * band <= draw < self.part * band else None

    def identity(self) -> dict[str, Any]:
        """What decides the split, for cache keys (a whole hold-out's key is the one it always had)."""
        return {"holdout": self.fraction} if self.parts == 1 else {"holdout": self.fraction,
                                                                   "part": [self.part, self.parts]}

    def label(self) -> str:
        """A short human description."""
        whole = f"a seeded {self.fraction:g} hold-out"
        return whole if self.parts == 1 else f"part {self.part} of {self.parts} of {whole}"


def _parse_fraction(value: str) -> Holdout:
    body = value[len("fraction:"):]
    fraction_text, _, part_text = body.partition(":")
    try:
        fraction = float(fraction_text)
    except ValueError:
        fraction = -1.0
    if not 0.0 < fraction < 1.0:
        raise HeadwiseError(
            f"validation {value!r}: the fraction must be a number between 0 and 1, e.g. 'fraction:0.05'"
        )
    if not part_text:
        return Holdout(fraction)
    match = re.fullmatch(r"(\d+)/(\d+)", part_text)
    if match is None or not 1 <= int(match[1]) <= int(match[2]):
        raise HeadwiseError(
            f"validation {value!r}: the part must be K/N with 1 <= K <= N, e.g. 'fraction:0.1:2/2' (the "
            "second half of a 10% hold-out)"
        )
    return Holdout(fraction, int(match[1]), int(match[2]))


def parse_validation(value: str) -> tuple[str, Any]:
    """``"auto"``, ``"split:NAME"``, ``"fraction:F[:K/N]"`` (a :class:`Holdout`) or a separate
    source, as (kind, argument)."""
    if value == "auto":
        return "auto", None
    if value.startswith("split:"):
        name = value[len("split:"):]
        if not name:
            raise HeadwiseError("validation 'split:' needs a split name, e.g. 'split:validation'")
        return "split", name
    if value.startswith("fraction:"):
        return "fraction", _parse_fraction(value)
    if not value:
        raise HeadwiseError("validation is empty: use 'auto', 'split:NAME', 'fraction:F' or a path")
    return "source", value


@dataclass(frozen=True)
class DataPlan:
    """A checked request: where training and validation documents come from."""

    train: Source
    #: separate validation data (a file, or another split), or None for a hold-out
    valid: Source | None
    holdout: Holdout | None
    subset: int | None
    subset_order: str
    seed: int
    tokenizer: str

    def request(self) -> dict[str, Any]:
        """Everything that decides the tokens: two equal requests give identical caches."""
        subset = None
        if self.subset is not None:
            subset = {"k": self.subset, "order": self.subset_order}
            if self.subset_order == "random":
                subset["seed"] = self.seed
        if self.valid is not None:
            validation: dict[str, Any] = {"source": self.valid.identity()}
        else:
            validation = {**self.holdout.identity(), "seed": self.seed}
        return {"train": self.train.identity(), "subset": subset, "validation": validation, "tokenizer": self.tokenizer}

    def describe(self) -> str:
        """One line for people."""
        subset = f", {self.subset_order} {self.subset} stories" if self.subset else ""
        valid = self.valid.label() if self.valid else self.holdout.label()
        return f"{self.train.label()}{subset}; validation: {valid}; tokenizer {self.tokenizer}"

    def train_documents(self) -> Iterator[str]:
        """Only the training documents (what a BPE is trained on)."""
        return (text for role, text in self._main() if role == "train")

    def documents(self) -> Iterator[tuple[str, str]]:
        """``("train" | "valid", text)`` pairs: the training source first, then separate validation data."""
        yield from self._main()
        if self.valid is not None:
            for text in self.valid.documents():
                yield "valid", text

    def _roles(self) -> Iterator[str | None]:
        """Each training-source story's role in order: "train", "valid" or None (left out)."""
        if self.holdout is None:
            return itertools.repeat("train")
        return map(self.holdout.role, _holdout_draws(self.seed))

    def _main(self) -> Iterator[tuple[str, str]]:
        if self.subset is None:
            for text, role in zip(self.train.documents(), self._roles()):
                if role is not None:
                    yield role, text
        elif self.subset_order == "first":
            taken = 0
            for text, role in zip(self.train.documents(), self._roles()):
                if role != "train":
                    if role is not None:
                        yield role, text
                    continue
                yield "train", text
                taken += 1
                if taken == self.subset:
                    return
            raise self._too_few(taken)
        else:
            yield from self._random_subset()

    def _random_subset(self) -> Iterator[tuple[str, str]]:
        n = self.train.count()
        roles = list(itertools.islice(self._roles(), n))
        candidates = np.flatnonzero([role == "train" for role in roles])
        if self.subset > len(candidates):
            raise self._too_few(len(candidates))
        keep = np.zeros(n, dtype=bool)
        keep[np.random.default_rng([self.seed, 2]).choice(candidates, self.subset, replace=False)] = True
        for i, text in enumerate(itertools.islice(self.train.documents(), n)):
            if roles[i] == "valid":
                yield "valid", text
            elif keep[i]:
                yield "train", text

    def _too_few(self, available: int) -> HeadwiseError:
        after = " after the hold-out" if self.holdout else ""
        return HeadwiseError(
            f"subset {self.subset} is larger than the source: {self.train.name} has only {available} "
            f"training stories{after}"
        )


def _holdout_draws(seed: int) -> Iterator[float]:
    # Drawn in blocks so the draw of story i depends only on (seed, i), never on a count.
    for block in itertools.count():
        yield from np.random.default_rng([seed, 1, block]).random(_BLOCK).tolist()


def plan_data(cfg: DataConfig) -> DataPlan:
    """Check a request against the files (or the hub) and decide where validation comes from."""
    train = open_source(cfg.source, cfg.format, cfg.field, cfg.split)
    kind, arg = parse_validation(cfg.validation)
    valid: Source | None = None
    holdout: Holdout | None = None
    if kind == "auto":
        if train.kind == "hub" and cfg.split != "validation" and "validation" in hub_splits(train.name):
            valid = open_source(train.name, "hub", train.field, "validation")
        else:
            holdout = Holdout(DEFAULT_HOLDOUT)
    elif kind == "split":
        if train.kind != "hub":
            raise HeadwiseError(
                f"validation {cfg.validation!r} needs a hub dataset, but {train.name} is a local {train.kind} "
                "source: use validation = 'fraction:0.05' or the path of a validation file"
            )
        if arg == cfg.split:
            raise HeadwiseError(f"validation split {arg!r} is the training split: pick another or a fraction")
        valid = open_source(train.name, "hub", train.field, arg)
    elif kind == "fraction":
        holdout = arg
    else:
        valid = open_source(arg, "auto", cfg.field, split="validation", strict_field=False)
        if valid.identity() == train.identity():
            raise HeadwiseError(f"validation {arg!r} is the training data itself: give separate data or a fraction")
    if holdout is not None and train.kind == "stream":
        raise HeadwiseError(
            f"{train.name} is one text stream, with no stories to hold out for validation: "
            "set validation to a separate file (e.g. tinystories-valid-sample.txt)"
        )
    return DataPlan(
        train=train,
        valid=valid,
        holdout=holdout,
        subset=cfg.subset,
        subset_order=cfg.subset_order,
        seed=cfg.seed,
        tokenizer=cfg.tokenizer,
    )
