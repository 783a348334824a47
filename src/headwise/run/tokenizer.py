"""A run's tokenizer: saved in the run folder when the run starts, read back by everything after.

A text run (``lm``, ``mlm``, ``glue``) writes the tokenizer it encodes its text with before it
trains, and its summary records it (``summary.json``'s ``tokenizer``: spec, vocabulary size,
end-of-text id and sha256, as :meth:`~headwise.text.tokenizer.Tokenizer.describe` gives):

- a trained BPE (``bpe:N``) is ``tokenizer.json``, the ``tokenizers`` library's file, whose text
  with its spec (``"bpe:N\\n" + text``) is what the sha256 hashes;
- a converted model's own tokenizer (``hf:N``, from ``headwise convert``) is its
  ``tokenizer.json`` too, hashed with its spec and its end-of-text id (the model's eos, which
  the record holds: it is read from there, the file alone does not say which token it is);
- GPT-Neo's BPE is recorded by name and hash only: its two files ship with an installed package
  and are checked against sha256s pinned in headwise on every load, so a copy (1.5 MB a run)
  would add nothing the hash does not check.

Fine-tuning (``tokenizer_from``, ``init_from``), ``headwise export`` and ``headwise generate``
read this file and never rebuild it: a BPE trained again on a corpus edited since gives other
ids to the same embeddings. A file that is missing, unreadable or not the one the summary
records is a :class:`~headwise.errors.RunFailure` (exit 1) naming it. Only a run an older
headwise made, which saved nothing, falls back to rebuilding, with one warning line.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headwise.errors import HeadwiseError, RunFailure
from headwise.run.layout import RunDir
from headwise.run.summary import read_summary

if TYPE_CHECKING:
    from headwise.text.tokenizer import Tokenizer


def task_tokenizer(task: Any) -> "Tokenizer | None":
    """The tokenizer a built task encodes its text with (its ``tokenizer``); None for tasks without text."""
    from headwise.text.tokenizer import Tokenizer

    tokenizer = getattr(task, "tokenizer", None)
    return tokenizer if isinstance(tokenizer, Tokenizer) else None


def tokenizer_record(tokenizer: "Tokenizer | None") -> dict[str, Any] | None:
    """What a run's summary records of its tokenizer (None for a run without one)."""
    return None if tokenizer is None else tokenizer.describe()


def save_run_tokenizer(run_dir: str | Path, tokenizer: "Tokenizer | None") -> None:
    """Write the file that defines a run's tokenizer into its folder (a trained BPE's or a
    converted model's ``tokenizer.json``; GPT-Neo's is recorded by name and hash only)."""
    if tokenizer is not None:
        tokenizer.save(RunDir(run_dir).tokenizer)


def check_resumed_tokenizer(run_dir: str | Path, tokenizer: "Tokenizer | None") -> None:
    """Refuse to resume a run whose task now encodes text with another tokenizer than the one
    its summary records (its training text, or its ``tokenizer_from`` run, changed since)."""
    summary = read_summary(run_dir)
    record = summary.tokenizer if summary is not None else None
    if record is None or tokenizer is None or record.get("sha256") == tokenizer.sha256:
        return
    raise HeadwiseError(
        f"{run_dir} trained with tokenizer {record.get('spec')} (sha256 {str(record.get('sha256'))[:12]}), but its "
        f"task now gives {tokenizer.spec} (sha256 {tokenizer.sha256[:12]}): its training text or tokenizer_from run "
        "changed since it started, and resuming would feed other ids to its embeddings; restore that data, or "
        "train anew with --overwrite"
    )


def read_run_tokenizer(run_dir: str | Path, spec: str | None, older: Callable[[], "Tokenizer"],
                       how: str) -> "Tokenizer":
    """The tokenizer run ``run_dir`` trained with: the one its summary records (its saved file,
    checked against the recorded sha256, or GPT-Neo's). A run without a record (an older
    headwise's) uses its saved file when it has one; else ``spec`` ``gpt-neo`` is GPT-Neo's and
    anything else is ``older()``, after one warning line saying ``how`` it is got instead.
    A recorded tokenizer that cannot be read back exactly is a RunFailure naming its file."""
    from headwise.text.tokenizer import gpt_neo_tokenizer, parse_tokenizer_spec, read_tokenizer

    run = RunDir(run_dir)
    summary = read_summary(run.path)
    record = summary.tokenizer if summary is not None else None
    if record is None:
        if run.tokenizer.is_file():  # saved before summaries recorded it: the file is what it trained with
            return _read_bpe(run.tokenizer, spec)
        if spec is not None and parse_tokenizer_spec(spec) is None:
            return gpt_neo_tokenizer()
        print(f"warning: {run.path} has no saved tokenizer (an older headwise made it): {how}", file=sys.stderr,
              flush=True)
        return older()
    if record.get("spec") == "none":  # `headwise convert` of a model whose tokenizer headwise cannot encode with
        raise HeadwiseError(f"{run.path} has no tokenizer headwise can use: {record.get('why', 'none was converted')}")
    try:
        recorded, digest = str(record["spec"]), str(record["sha256"])
        n = parse_tokenizer_spec(recorded)
    except (KeyError, TypeError, HeadwiseError):
        raise RunFailure(f"{run.summary} is damaged: its tokenizer record {record!r} names no tokenizer") from None
    if n is not None and not run.tokenizer.is_file():
        what = "is not a file" if run.tokenizer.exists() else "is missing"
        raise RunFailure(f"{run.tokenizer} {what}: {run.summary} records the run's {recorded} there (sha256 "
                         f"{digest[:12]}); restore the file from a copy of the run (it is never rebuilt)")
    try:
        tokenizer = read_tokenizer(record, run.tokenizer)
    except (KeyError, TypeError, ValueError):
        raise RunFailure(f"{run.summary} is damaged: its tokenizer record {record!r} has no end-of-text id") from None
    except HeadwiseError as exc:
        raise RunFailure(f"{exc}; restore the file from a copy of the run (it is never rebuilt)") from None
    if tokenizer.sha256 == digest:
        return tokenizer
    if n is None:
        raise RunFailure(f"{run.path} trained with a gpt-neo tokenizer of sha256 {digest[:12]}, but this headwise's "
                         f"is {tokenizer.sha256[:12]}: use the headwise version that trained it")
    raise RunFailure(f"{run.tokenizer} is damaged: its sha256 {tokenizer.sha256[:12]} is not the {digest[:12]} "
                     f"{run.summary.name} records; restore the file from a copy of the run (it is never rebuilt)")


def _read_bpe(path: Path, spec: str | None) -> "Tokenizer":
    """A saved ``tokenizer.json`` as a BPE of ``spec`` (without one: as many ids as the file has,
    plus end-of-text); a RunFailure naming the file when it is not one."""
    from tokenizers import Tokenizer as Backend

    from headwise.text.tokenizer import BPETokenizer, parse_tokenizer_spec

    try:
        text = path.read_text(encoding="utf-8")
        n = parse_tokenizer_spec(spec) if spec is not None else Backend.from_str(text).get_vocab_size() + 1
        return BPETokenizer(n, text)
    except HeadwiseError as exc:
        raise RunFailure(f"{path} is damaged: {exc}") from None
    except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise RunFailure(f"{path} is damaged: it is not a tokenizer file ({reason})") from None
