"""Encoders in the Hugging Face ecosystem: HeadwiseForMaskedLM (``outputs = "mlm"``) and the
sequence classifier on Crammed BERT's options against headwise's own model, and a masked-LM run
exported, then loaded offline in a fresh process without headwise through AutoModelForMaskedLM
and AutoTokenizer."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers", reason="transformers (the hf extra) is not installed")

from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification  # noqa: E402

from headwise.cli import main  # noqa: E402
from headwise.hf.masked_tokenizer import masked_hf_tokenizer  # noqa: E402
from headwise.hf.models import HeadwiseForMaskedLM, from_headwise, load_export  # noqa: E402
from headwise.model import Transformer  # noqa: E402
from headwise.presets import spec_from_preset  # noqa: E402
from headwise.text.masked_vocab import MASK_ID, PAD_ID, MaskedVocab  # noqa: E402
from headwise.train.generate import load_run_model, run_config, run_tokenizer  # noqa: E402
from tests.test_hf_export import _fresh_process  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

#: a padded batch of [CLS] ... [SEP] rows: [PAD] (0) after the first row's [SEP]
IDS = torch.tensor([[1, 7, 8, MASK_ID, 9, 2, PAD_ID, PAD_ID], [1, 10, 11, 12, 13, 14, 15, 2]])


def _encoder(**fields) -> Transformer:
    """A small model of crammed-bert-tiny's architecture (gated GELU, scaled sinusoidal positions,
    LayerNorm on the embeddings, no biases), heterogeneous heads, [PAD] masked."""
    torch.manual_seed(0)
    base = dict(vocab_size=40, d_model=32, mlp_hidden=64, n_layers=2, heads=[4, 2], max_seq_len=16, pad_id=0,
                init_std=0.3)
    return Transformer(spec_from_preset("crammed-bert-tiny", **{**base, **fields})).eval()


def test_masked_lm_equals_headwise_on_a_padded_batch_and_round_trips(tmp_path):
    model = _encoder()
    hf = from_headwise(model)
    assert isinstance(hf, HeadwiseForMaskedLM)
    labels = torch.full_like(IDS, -100)
    labels[0, 3], labels[1, 4] = 5, 13
    with torch.no_grad():
        expected = model(IDS)
        out = hf(IDS, attention_mask=(IDS != PAD_ID).long(), labels=labels)
    assert torch.equal(out.logits, expected)
    # the loss is the mean cross-entropy of the two labelled positions
    reference = (F.cross_entropy(expected[0, 3:4], torch.tensor([5])) + F.cross_entropy(expected[1, 4:5],
                                                                                         torch.tensor([13]))) / 2
    torch.testing.assert_close(out.loss, reference)
    # padding is masked: the padded row's logits are those of the row alone (up to float noise)
    with torch.no_grad():
        alone = model(IDS[:1, :6])
    torch.testing.assert_close(expected[0, :6], alone[0], rtol=1e-5, atol=1e-5)
    hf.save_pretrained(tmp_path / "mlm")
    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path / "mlm").eval()
    assert type(loaded) is HeadwiseForMaskedLM
    # the sinusoid table is not saved: loading computes it again, so the logits are the same numbers
    with torch.no_grad():
        assert torch.equal(loaded(IDS).logits, expected)
    assert loaded.model.lm_head.weight is loaded.model.tok_emb.weight  # the decoder stays tied
    assert loaded.model.tok_emb.padding_idx == PAD_ID  # [PAD]'s row takes no gradient from the lookup


def test_masked_lm_refuses_a_padding_mask_it_does_not_apply():
    with pytest.raises(ValueError, match="pad_id"):
        from_headwise(_encoder())(IDS, attention_mask=torch.ones_like(IDS))
    unpadded = from_headwise(_encoder(pad_id=None))
    with pytest.raises(ValueError, match="no pad_id, so it masks no padding"):
        unpadded(IDS, attention_mask=(IDS != PAD_ID).long())
    assert unpadded(IDS[1:], attention_mask=torch.ones_like(IDS[1:])).logits.shape == (1, 8, 40)


def test_an_encoder_classifier_with_crammed_options_loads_with_auto_sequence_classification(tmp_path):
    model = _encoder(outputs="classes", num_classes=3, pooling="mean")
    hf = from_headwise(model)
    with torch.no_grad():
        expected = model(IDS)
        assert torch.equal(hf(IDS, attention_mask=(IDS != PAD_ID).long()).logits, expected)
    hf.save_pretrained(tmp_path / "classifier")
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "classifier").eval()
    with torch.no_grad():
        assert torch.equal(loaded(IDS).logits, expected)


# ------------------------------------------------------------------ a trained run, exported


@pytest.fixture(scope="module")
def mlm_run(tmp_path_factory):
    from tests.conftest import shared_data_dir

    root = tmp_path_factory.mktemp("mlm")
    with pytest.MonkeyPatch.context() as mp:  # for the whole module: the runs read the data's token cache
        mp.setenv("HEADWISE_DATA", str(shared_data_dir()))
        mp.setenv("HEADWISE_CACHE", str(root / "cache"))
        out = root / "run"
        assert main(["train", str(CONFIGS / "mlm-tiny.toml"), "--out", str(out), "--set", "train.steps=2",
                     "--set", "eval.every=0", "--set", "checkpoint.every=0", "--set", "task.block_size=32",
                     "--set", "train.micro_batch=4", "--set", "task.eval_batches=1", "--set", "task.eval_batch_size=2",
                     "--set", "model.n_layers=2", "--set", "model.heads=[4,2]", "--set", "model.pad_id=0"]) == 0
        yield out


FRESH_PROCESS = textwrap.dedent("""
    import json, sys
    sys.modules["headwise"] = None  # headwise must not be importable here
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline
    path, texts = sys.argv[1], json.loads(sys.argv[2])
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
    model = AutoModelForMaskedLM.from_pretrained(path, trust_remote_code=True).eval()
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
    fill = pipeline("fill-mask", model=model, tokenizer=tokenizer, top_k=1)("Once upon a time, there was a [MASK].")
    print(json.dumps({"class": type(model).__name__, "module": type(model).__module__,
                      "input_ids": batch.input_ids.tolist(), "attention_mask": batch.attention_mask.tolist(),
                      "logits": logits.tolist(), "mask_id": tokenizer.mask_token_id, "pad_id": tokenizer.pad_token_id,
                      "fill_id": fill[0]["token"], "decoded": tokenizer.decode(batch.input_ids[1])}))
""")


def test_an_exported_mlm_run_loads_offline_without_headwise(mlm_run, tmp_path, capsys):
    out = tmp_path / "export"
    assert main(["export", str(mlm_run), "--hf", str(out)]) == 0
    assert "HeadwiseForMaskedLM" in capsys.readouterr().out
    # model.py: the mlm head's code, from the encoder family's folder
    for name in ("config.json", "model.safetensors", "modeling_headwise.py", "model.py", "tokenizer.json", "README.md",
                 "headwise_config.toml"):
        assert (out / name).is_file(), name
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"]["AutoModelForMaskedLM"] == "modeling_headwise.HeadwiseForMaskedLM"
    card = (out / "README.md").read_text()
    assert "pipeline_tag: fill-mask" in card and "bidirectional encoder (a masked language model)" in card
    assert "| 1 | 2 | 64 | 128 | global | 512 |" in card and "LayerNorm on the embeddings" in card

    texts = ["Once upon a time, there was a [MASK].", "Tom had a big red ball. He liked to play with it every day."]
    got = _fresh_process(FRESH_PROCESS, tmp_path, str(out), json.dumps(texts))
    assert got["class"] == "HeadwiseForMaskedLM" and got["module"].startswith("transformers_modules")
    assert (got["mask_id"], got["pad_id"]) == (MASK_ID, PAD_ID)

    # the tokenizer gives the task's ids ([MASK] with its space stands where " cat" would), padded with [PAD]
    vocab = MaskedVocab(run_tokenizer(mlm_run, run_config(mlm_run)))
    plain = vocab.encode("Once upon a time, there was a cat.")
    cat = vocab.encode(" cat")[1:-1]
    assert len(cat) == 1, "the test needs ' cat' to be one token"
    first = [MASK_ID if i == cat[0] else i for i in plain]
    second = vocab.encode(texts[1])
    width = max(len(first), len(second))
    ids = torch.tensor([row + [PAD_ID] * (width - len(row)) for row in (first, second)])
    assert got["input_ids"] == ids.tolist()
    assert got["attention_mask"] == (ids != PAD_ID).long().tolist()
    assert got["decoded"] == vocab.decode(second)

    # the logits are headwise's model's, padding included
    model, _ = load_run_model(mlm_run)
    with torch.no_grad():
        expected = model(ids)
    torch.testing.assert_close(torch.tensor(got["logits"]), expected, rtol=0, atol=1e-6)
    # fill-mask's top guess is headwise's largest logit at the [MASK]
    assert got["fill_id"] == int(expected[0, first.index(MASK_ID)].argmax())

    back = load_export(out)
    assert back.spec == model.spec
    for (k, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), k


def test_the_tokenizer_reads_text_as_the_task_does(mlm_run):
    tokenizer = run_tokenizer(mlm_run, run_config(mlm_run))
    vocab, hf = MaskedVocab(tokenizer), masked_hf_tokenizer(tokenizer)
    # a literal end-of-text is ordinary text in both; so are brackets that name no special token
    for text in ("Lily saw a dog.", " two  spaces\n\nand lines ", "a <|endoftext|> inside", "[CLS-like] text"):
        assert hf(text).input_ids == vocab.encode(text), text
        assert hf.decode(vocab.encode(text)) == vocab.decode(vocab.encode(text))
    assert len(hf) == vocab.vocab_size


def test_what_the_export_cannot_express_is_refused_in_one_line(mlm_run, tmp_path, capsys):
    target = tmp_path / "neo"
    assert main(["export", str(mlm_run), "--hf", str(target), "--gpt-neo"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "outputs = 'mlm'" in err and "--gpt-neo" in err
    assert not target.exists()


FRESH_CLASSIFIER = textwrap.dedent("""
    import json, sys
    sys.modules["headwise"] = None  # headwise must not be importable here
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    path, pairs = sys.argv[1], json.loads(sys.argv[2])
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
    model = AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True).eval()
    batch = tokenizer([a for a, _ in pairs], [b for _, b in pairs], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
    print(json.dumps({"class": type(model).__name__, "input_ids": batch.input_ids.tolist(), "logits": logits.tolist()}))
""")


def test_an_exported_glue_run_loads_as_a_sequence_classifier_with_its_pretraining_vocabulary(mlm_run, tmp_path,
                                                                                             capsys):
    from headwise.families.encoder.glue_task import encode_pair

    ft = tmp_path / "ft"
    with pytest.MonkeyPatch.context() as mp:
        from tests.conftest import shared_data_dir

        mp.setenv("HEADWISE_DATA", str(shared_data_dir()))
        mp.setenv("HEADWISE_CACHE", str(mlm_run.parent / "cache"))  # the pretraining run's token cache
        assert main(["train", str(CONFIGS / "glue-tiny.toml"), "--out", str(ft), "--set", f"train.init_from={mlm_run}",
                     "--set", f"task.tokenizer_from={mlm_run}", "--set", "train.steps=2", "--set", "eval.every=0",
                     "--set", "checkpoint.every=0", "--set", "model.n_layers=2", "--set", "model.heads=[4,2]",
                     "--set", "task.max_length=32"]) == 0
        out = tmp_path / "export"
        assert main(["export", str(ft), "--hf", str(out)]) == 0
    assert "HeadwiseForSequenceClassification" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"]["AutoModelForSequenceClassification"] == "modeling_headwise.HeadwiseForSequenceClassification"
    assert (out / "tokenizer.json").is_file() and config["spec"]["num_classes"] == 2
    card = (out / "README.md").read_text()
    assert "tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)" in card
    assert "a first-token tanh pooler of width 1024 and 2 classes" in card and "`[CLS] a [SEP] b [SEP]`" in card
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 32

    pairs = [["Tom had a ball.", "He liked to play with it every day."], ["Lily saw a dog.", "It was big."]]
    got = _fresh_process(FRESH_CLASSIFIER, tmp_path, str(out), json.dumps(pairs))
    assert got["class"] == "HeadwiseForSequenceClassification"
    # the tokenizer frames a pair as fine-tuning does: [CLS] a [SEP] b [SEP]
    vocab = MaskedVocab(run_tokenizer(mlm_run, run_config(mlm_run)))
    rows = [encode_pair(vocab, a, b, 32) for a, b in pairs]
    width = max(map(len, rows))
    ids = torch.tensor([row + [PAD_ID] * (width - len(row)) for row in rows])
    assert got["input_ids"] == ids.tolist()
    model, _ = load_run_model(ft)
    with torch.no_grad():
        expected = model.eval()(ids)  # fine-tuned with dropout: compared without
    torch.testing.assert_close(torch.tensor(got["logits"]), expected, rtol=0, atol=1e-6)
