"""``headwise convert`` of a Llama or a Qwen3 with its own tokenizer (``hf:N``).

A BPE trained with ``tokenizers`` on a few sentences is wrapped in the model's own ``transformers``
tokenizer class (Llama's: bos ``<s>`` added to every text, eos ``</s>``; Qwen2's: no bos, eos
``<|im_end|>``) and saved beside a tiny random model (Qwen3's embeddings padded past the
tokenizer's ids, as Qwen3 pads them). Against ``AutoTokenizer`` on that folder and the
``transformers`` model: headwise's ids, ``headwise generate``'s greedy ids and text, the
log-likelihoods ``headwise eval`` scores with, the token cache ``headwise analyze`` reads, and
``AutoTokenizer`` on ``headwise export``'s folder. A damaged ``tokenizer.json`` exits 2 in one
line, writing nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers (the hf extra) is not installed")
if not hasattr(transformers, "Qwen3ForCausalLM"):
    pytest.skip("this transformers has no Qwen3", allow_module_level=True)

from conftest import shared_data_dir  # noqa: E402
from decoder_parity import perturbed  # noqa: E402
from headwise.cli import main  # noqa: E402
from headwise.errors import HeadwiseError  # noqa: E402
from headwise.hf.architectures import architectures  # noqa: E402
from headwise.hf.tokenizer import from_hf_tokenizer  # noqa: E402
from headwise.run import RunDir, read_summary  # noqa: E402
from headwise.spec import ModelSpec  # noqa: E402
from headwise.text.tokenizer import TOKENIZER_FILE, HFTokenizer, parse_tokenizer_spec, read_tokenizer  # noqa: E402
from headwise.train.generate import generate, load_run_model, run_config, run_tokenizer  # noqa: E402
from helpers import one_thread  # noqa: E402,F401  (one torch thread for this module)
from test_convert import CASES, CLASSES, LLAMA_STYLE  # noqa: E402

SENTENCES = [
    "Once upon a time there was a little girl named Lily.", "She liked to play with her big red ball in the park.",
    "One day, a friendly dog came to play with her.", "They ran and jumped and laughed all day long.",
    'Tom said, "Can I play too?" and Lily said yes!', "The sun was warm and the sky was blue.",
]
TEXTS = ["Once upon a time, Lily saw a big dog.", "", "  two  spaces ", "tab\tand\nnew lines\n\n", "héllo wörld 日本",
         'Tom said, "Can I play?"', "zzz qqq"]
#: Qwen3's embeddings past its tokenizer's ids (Qwen3-0.6B: 151,936 rows for 151,669 ids)
QWEN_PADDING = 21
PROMPT = "Once upon a time"


def _trained(pre_tokenizer, specials: list[str], vocab_size: int, **bpe) -> tuple[dict, list[tuple[str, str]]]:
    """The vocabulary and merges of a BPE trained on :data:`SENTENCES`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE(**bpe))
    backend.pre_tokenizer = pre_tokenizer
    alphabet = pre_tokenizers.ByteLevel.alphabet() if isinstance(pre_tokenizer, pre_tokenizers.ByteLevel) else []
    backend.train_from_iterator(SENTENCES * 4, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=alphabet, show_progress=False))
    model = json.loads(backend.to_str())["model"]
    return model["vocab"], [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]


def own_tokenizer(name: str):
    """The model's own ``transformers`` tokenizer class around a BPE trained on a few sentences."""
    from tokenizers import pre_tokenizers

    if name == "llama":
        vocab, merges = _trained(pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False),
                                 ["<unk>", "<s>", "</s>"], 200, unk_token="<unk>", byte_fallback=True)
        return transformers.LlamaTokenizerFast(vocab=vocab, merges=merges, add_bos_token=True)
    vocab, merges = _trained(pre_tokenizers.ByteLevel(add_prefix_space=False),
                             ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], 300)
    return getattr(transformers, "Qwen2TokenizerFast", transformers.Qwen2Tokenizer)(
        vocab=vocab, merges=merges, eos_token="<|im_end|>")


def save_with_own_tokenizer(folder: Path, name: str):
    """A tiny random ``name`` model and its own tokenizer saved in ``folder``; returns (model, tokenizer)."""
    tokenizer = own_tokenizer(name)
    vocab = len(tokenizer) + (QWEN_PADDING if name == "qwen3" else 0)
    config = architectures()[name].to_config(ModelSpec(**{**LLAMA_STYLE, **CASES[name][0], "vocab_size": vocab}))
    config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    torch.manual_seed(0)
    hf = getattr(transformers, CLASSES[name])(config).eval()
    perturbed(hf, seed=1)
    hf.generation_config.pad_token_id = tokenizer.eos_token_id
    hf.save_pretrained(folder)
    tokenizer.save_pretrained(str(folder))
    return hf, transformers.AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def converted(request, tmp_path_factory):
    """(name, the transformers folder, its model, AutoTokenizer on it, the converted run)."""
    root = tmp_path_factory.mktemp(request.param)
    hf, auto = save_with_own_tokenizer(root / "hf", request.param)
    run = root / "run"
    data = shared_data_dir()
    assert main(["convert", str(root / "hf"), "--out", str(run),
                 "--set", f"task.source={data / 'tinystories-train-sample.txt'}",
                 "--set", f"task.validation={data / 'tinystories-valid-sample.txt'}", "--set", "task.block_size=32",
                 "--set", "task.eval_batches=1", "--set", "task.eval_batch_size=2"]) == 0
    return request.param, root / "hf", hf, auto, run


def test_the_converted_tokenizer_gives_autotokenizers_ids(converted):
    name, _, hf, auto, run = converted
    summary = read_summary(run)
    assert summary.tokenizer["spec"] == f"hf:{hf.config.vocab_size}" == run_config(run).task.tokenizer
    tokenizer = run_tokenizer(run, run_config(run))
    assert isinstance(tokenizer, HFTokenizer) and tokenizer.sha256 == summary.tokenizer["sha256"]
    assert tokenizer.eot_id == auto.eos_token_id == hf.config.eos_token_id
    assert tokenizer.bos_id == (auto.bos_token_id if name == "llama" else None)
    assert tokenizer.vocab_size - len(auto) == (QWEN_PADDING if name == "qwen3" else 0)
    for text in TEXTS:
        ids = auto(text).input_ids
        assert tokenizer.encode(text) == ids, text
        assert (ids[:1] == [auto.bos_token_id]) == (name == "llama")  # Llama's post-processor adds its bos
        assert tokenizer.decode(ids) == auto.decode(ids)
    # documents: each as the tokenizer encodes it, then the eos; a long one is encoded whole
    long = "\n".join(SENTENCES * 500)
    assert len(long) > 1 << 16
    docs = [TEXTS[0], "", long]
    expected = [i for doc in docs for i in auto(doc).input_ids + [auto.eos_token_id]]
    assert tokenizer.encode_documents(docs).tolist() == expected
    # a special token written in a text is text, as everywhere in headwise
    assert auto.eos_token_id not in tokenizer.encode(f"the end {auto.eos_token} of it")


def test_generate_is_transformers_greedy_decoding(converted, capsys):
    _, _, hf, auto, run = converted
    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", PROMPT, "--temperature", "0", "--max-new-tokens", "8",
                 "--json"]) == 0
    text = json.loads(capsys.readouterr().out)["text"]
    prompt = auto(PROMPT, return_tensors="pt").input_ids
    theirs = hf.generate(prompt, max_new_tokens=8, do_sample=False)[0, prompt.shape[1]:].tolist()
    tokenizer = run_tokenizer(run, run_config(run))
    ours = generate(load_run_model(run)[0], tokenizer.encode(PROMPT), 8, temperature=0, stop_id=tokenizer.eot_id)
    assert ours == theirs and text == auto.decode(theirs)


def test_export_writes_the_tokenizer_back(converted, tmp_path, capsys):
    _, _, _, auto, run = converted
    out = tmp_path / "export"
    assert main(["export", str(run), "--hf", str(out)]) == 0
    back = transformers.AutoTokenizer.from_pretrained(str(out))
    for text in TEXTS:
        ids = auto(text).input_ids
        assert back(text).input_ids == ids and back.decode(ids) == auto.decode(ids), text
    assert (back.eos_token_id, back.bos_token_id) == (auto.eos_token_id, auto.bos_token_id or auto.eos_token_id)
    # and converted again: the same tokenizer, byte for byte
    again = tmp_path / "again"
    assert main(["convert", str(out), "--out", str(again)]) == 0
    capsys.readouterr()
    assert read_summary(again).tokenizer == read_summary(run).tokenizer
    assert RunDir(again).tokenizer.read_bytes() == RunDir(run).tokenizer.read_bytes()


def test_analyze_reads_the_text_as_the_tokenizer_encodes_it(converted, capsys, monkeypatch, tmp_path):
    from headwise.train.generate import run_task

    _, _, _, auto, run = converted
    monkeypatch.setenv("HEADWISE_CACHE", str(tmp_path / "cache"))
    capsys.readouterr()
    assert main(["analyze", str(run), "--batches", "1"]) == 0
    assert "step 0: condition number" in capsys.readouterr().out
    # the validation sample is one text stream: one document, its bos (Llama's) first and its eos last
    valid = run_task(run, run_config(run)).cache.tokens("valid")
    text = (shared_data_dir() / "tinystories-valid-sample.txt").read_text(encoding="utf-8")
    assert valid.tolist() == auto(text).input_ids + [auto.eos_token_id]


def _loglikelihoods(hf, auto, pairs: list[tuple[str, str]], context: int) -> list[float]:
    """Summed log-probabilities of each continuation after its context as lm-eval asks for them
    (the context's ids, then those of the whole past as many ids; cut from the left to the model's
    context), computed by the ``transformers`` model on ``AutoTokenizer``'s ids."""
    lls = []
    for prefix, continuation in pairs:
        start = auto(prefix).input_ids
        tail = auto(prefix + continuation).input_ids[len(start):]
        ids, n = (start + tail)[-(context + 1):], len(tail)
        with torch.no_grad():
            logprobs = torch.log_softmax(hf(torch.tensor([ids[:-1]])).logits.double(), dim=-1)[0]
        lls.append(float(logprobs[-n:].gather(-1, torch.tensor(ids[-n:])[:, None]).sum()))
    return lls


def test_eval_scores_the_log_likelihoods_transformers_gives(converted, tmp_path, capsys):
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from headwise.hf.evaluation.local_tasks import STORY_ENDINGS, read_examples
    from headwise.hf.models import from_run
    from headwise.hf.tokenizer import run_hf_tokenizer

    _, _, hf, auto, run = converted
    context = run_config(run).model.to_dict()["max_seq_len"]
    pairs = [("Once upon a time there was", " a little girl."), ("Lily", " liked to play."),
             (SENTENCES[2] * 4, " They ran and jumped.")]  # the last is cut to the model's context
    lm = HFLM(pretrained=from_run(run)[0], backend="causal", tokenizer=run_hf_tokenizer(run), batch_size=2,
              max_length=context)
    ours = [ll for ll, _ in lm.loglikelihood([Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)])]
    assert ours == pytest.approx(_loglikelihoods(hf, auto, pairs, context), abs=1e-4)

    text = shared_data_dir() / "tinystories-valid-sample.txt"
    assert main(["eval", str(run), "--tasks", STORY_ENDINGS, "--text", str(text), "--limit", "6",
                 "--examples", "12"]) == 0
    capsys.readouterr()
    scores = json.loads((run / "eval" / "lm-eval.json").read_text())["scores"][STORY_ENDINGS]
    examples = read_examples(run / "eval" / "tasks", STORY_ENDINGS)[:6]
    lls = [_loglikelihoods(hf, auto, [(e["context"], " " + c) for c in e["choices"]], context) for e in examples]
    assert scores["acc"] == pytest.approx(sum(max(range(4), key=ll.__getitem__) == e["label"]
                                              for ll, e in zip(lls, examples)) / len(examples))


def test_a_damaged_tokenizer_file_is_refused_in_one_line(tmp_path, capsys):
    save_with_own_tokenizer(tmp_path / "hf", "llama")
    path = tmp_path / "hf" / "tokenizer.json"
    path.write_bytes(path.read_bytes()[:200])
    out = tmp_path / "out" / "run"
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "hf"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "its tokenizer cannot be read" in err and "nothing was written" in err
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_without_an_eos_or_with_more_ids_has_no_headwise_counterpart():
    auto = own_tokenizer("qwen3")
    assert from_hf_tokenizer(auto, len(auto))[0].spec == f"hf:{len(auto)}"
    tokenizer, why = from_hf_tokenizer(auto, len(auto) - 1)
    assert tokenizer is None and f"more than the model's {len(auto) - 1} embeddings" in why
    auto.eos_token = None
    tokenizer, why = from_hf_tokenizer(auto, len(auto))
    assert tokenizer is None and "no eos token" in why


def test_a_saved_tokenizer_is_read_back_exactly_or_refused(tmp_path):
    from tokenizers import processors

    auto = own_tokenizer("llama")
    backend = auto.backend_tokenizer
    tokenizer = HFTokenizer(len(auto) + 3, backend.to_str(), auto.eos_token_id)
    tokenizer.save(tmp_path / TOKENIZER_FILE)
    back = read_tokenizer(tokenizer.describe(), tmp_path / TOKENIZER_FILE)
    assert back.sha256 == tokenizer.sha256 and back.bos_id == auto.bos_token_id == 1
    # the end-of-text is part of what the hash covers: the file alone does not say which token it is
    assert HFTokenizer(len(auto) + 3, backend.to_str(), auto.bos_token_id).sha256 != tokenizer.sha256
    (tmp_path / TOKENIZER_FILE).write_text("{")
    with pytest.raises(HeadwiseError, match="is damaged: it is not a tokenizer file"):
        read_tokenizer(tokenizer.describe(), tmp_path / TOKENIZER_FILE)
    with pytest.raises(HeadwiseError, match="more than the model's 10 embeddings"):
        HFTokenizer(10, backend.to_str(), 2)
    # a post-processor that adds two ids before a text has no place in headwise's documents
    backend.post_processor = processors.TemplateProcessing(single="<s> <s> $A", special_tokens=[("<s>", 1)])
    with pytest.raises(HeadwiseError, match="post-processor"):
        HFTokenizer(len(auto), backend.to_str(), auto.eos_token_id)
    assert parse_tokenizer_spec("hf:7") == 7
    with pytest.raises(HeadwiseError, match="at least one id"):
        parse_tokenizer_spec("hf:0")
