"""Front ends and output heads: the registries, the spec fields that choose them, their exact
parameter counts, and the state-dict keys saved models depend on."""

import random

import pytest
import torch
from torch import nn

from headwise.errors import HeadwiseError
from headwise.hf.gpt_neo import GPT_NEO
from headwise.model.outputs import OutputHead
from headwise.model import FRONT_ENDS, OUTPUT_HEADS, SequenceTooLong, Transformer, load_pretrained, save_pretrained
from headwise.params import count_params, param_breakdown
from headwise.parts import FRONT_END_PARTS, OUTPUT_HEAD_PARTS, OutputHeadPart
from headwise.spec import ModelSpec, front_ends, output_heads


def test_registries_name_what_the_spec_allows():
    assert front_ends() is FRONT_END_PARTS and output_heads() is OUTPUT_HEAD_PARTS
    # every declared part has its model code (listing the declarations imports every family's model
    # modules, and with them the code of their parts), and what the model code reads of itself is its
    # declaration's
    declared = FRONT_END_PARTS.names(), OUTPUT_HEAD_PARTS.names()
    assert (FRONT_ENDS.names(), OUTPUT_HEADS.names()) == declared
    assert {part.default_outputs for _, part in FRONT_END_PARTS.items()} <= set(OUTPUT_HEAD_PARTS.names())
    for name, part in OUTPUT_HEAD_PARTS.items():
        assert (OUTPUT_HEADS[name].vocabulary, OUTPUT_HEADS[name].pooled) == (part.vocabulary, part.pooled), name
    with pytest.raises(ValueError, match="Input should be 'images', 'token_pairs', 'tokens' or 'vectors'"):
        ModelSpec(inputs="audio", d_model=8, n_layers=1, heads=[2])


def _random_spec(rng: random.Random) -> ModelSpec:
    n_layers = rng.randint(1, 4)
    d_model = rng.choice([8, 12, 16, 24])
    heads = [rng.randint(1, 5) for _ in range(n_layers)]
    head_dim = rng.choice([rng.randint(1, 9), [rng.randint(1, 9) for _ in range(n_layers)]])
    inputs = rng.choice(FRONT_END_PARTS.names())
    tokens = FRONT_END_PARTS[inputs].vocabulary
    outputs = rng.choice([None] + [o for o in OUTPUT_HEAD_PARTS if tokens or not OUTPUT_HEAD_PARTS[o].vocabulary])
    head = outputs or FRONT_END_PARTS[inputs].default_outputs
    fields = {"max_seq_len": rng.randint(4, 32), "causal": head == "lm" or (head != "mlm" and rng.random() < 0.5)}
    if inputs == "images":  # positions follow from the image and patch sizes
        patch = rng.choice([1, 2, 3])
        fields = {"image_size": patch * rng.randint(1, 4), "patch_size": patch, "channels": rng.choice([1, 3]),
                  "causal": False}
    if head in ("classes", "pair_classes", "cls_pooler"):
        fields.update(num_classes=rng.randint(2, 12), classifier_hidden=rng.choice([None, rng.randint(1, 9)]),
                      pooling=rng.choice(["cls", "mean"]))
    if not fields["causal"]:  # Nyström layers, with or without their convolution
        fields.update(attention=[rng.choice(["global", "nystrom"]) for _ in range(n_layers)],
                      nystrom_conv=rng.choice([None, 3, 5]))
    activation = rng.choice(["gelu_new", "geglu"])  # a gated MLP needs an even width
    mlp_hidden = rng.choice([None, 2 * rng.randint(1, 15) if activation == "geglu" else rng.randint(1, 30)])
    return ModelSpec(
        inputs=inputs, outputs=outputs, vocab_size=rng.randint(5, 40) if tokens else None,
        d_model=d_model, n_layers=n_layers, heads=heads, head_dim=head_dim, activation=activation,
        mlp_hidden=mlp_hidden, norm=rng.choice(["layernorm_pre", "unitnorm_post"]),
        positions=rng.choice(["learned", "none", "scaled_sinusoid"]), embedding_norm=rng.choice([None, "layernorm"]),
        tie_embeddings=rng.random() < 0.5, qkv_bias=rng.random() < 0.5, **fields,
    )


def _numel(module: nn.Module | None, exclude: set[int] = frozenset()) -> int:
    if module is None:
        return 0
    return sum(p.numel() for p in module.parameters() if id(p) not in exclude)


def test_every_front_end_and_head_counts_exactly_what_it_builds():
    rng = random.Random(1)
    seen = set()
    for _ in range(200):
        spec = _random_spec(rng)
        seen.add((spec.inputs, spec.output_head))
        model = Transformer(spec)
        assert count_params(spec) == model.num_params(), spec
        front, head = FRONT_ENDS[spec.inputs], OUTPUT_HEADS[spec.output_head]
        front_modules = [getattr(model, name) for name in front.build(spec)]
        front_params = {id(p) for m in front_modules if m is not None for p in m.parameters()}
        counted = FRONT_END_PARTS[spec.inputs].param_counts(spec)
        assert sum(counted.values()) == sum(_numel(m) for m in front_modules), spec
        # a head's weights tied to the front end are counted there, not again
        head_built = sum(_numel(getattr(model, name), front_params) for name in head.build(spec, model))
        assert sum(OUTPUT_HEAD_PARTS[spec.output_head].param_counts(spec).values()) == head_built, spec
    assert seen == {(i, o) for i in FRONT_END_PARTS for o in OUTPUT_HEAD_PARTS
                    if FRONT_END_PARTS[i].vocabulary or not OUTPUT_HEAD_PARTS[o].vocabulary}


def test_state_dict_keys_are_those_of_saved_models():
    spec = ModelSpec(vocab_size=30, d_model=8, n_layers=1, heads=[2], tie_embeddings=False)
    block = ["norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.out.weight", "attn.out.bias", "norm2.weight",
             "norm2.bias", "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"]
    blocks = [f"blocks.0.{k}" for k in block]
    assert list(Transformer(spec).state_dict()) == ["tok_emb.weight", "pos_emb.weight", *blocks, "norm_f.weight",
                                                    "norm_f.bias", "lm_head.weight"]
    vectors = ModelSpec(vocab_size=None, d_model=8, n_layers=1, heads=[2])
    assert list(Transformer(vectors).state_dict()) == ["pos_emb.weight", *blocks, "norm_f.weight", "norm_f.bias"]
    assert not hasattr(Transformer(vectors), "tok_emb")  # a vector model has no vocabulary at all


def test_token_inputs_with_vector_outputs(tmp_path):
    spec = ModelSpec(vocab_size=30, d_model=8, n_layers=2, heads=[2, 4], outputs="vectors")
    model = Transformer(spec).eval()
    assert not hasattr(model, "lm_head") and count_params(spec) == model.num_params()
    assert "lm_head" not in param_breakdown(spec)
    x = torch.randint(0, 30, (2, 5))
    assert model(x).shape == (2, 5, 8) and model(x, pad_vocab=True).shape == (2, 5, 8)
    assert "outputs = 'vectors'" in GPT_NEO.incompatibility(spec)
    save_pretrained(model, tmp_path / "m")
    loaded = load_pretrained(tmp_path / "m").eval()
    assert loaded.spec == spec
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


def test_outputs_default_to_the_inputs_head_and_are_not_saved_unless_set():
    assert ModelSpec(d_model=8, n_layers=1, heads=[2]).output_head == "lm"
    assert ModelSpec(vocab_size=None, d_model=8, n_layers=1, heads=[2]).output_head == "vectors"
    # a spec.json or config.toml written before `outputs` existed reads the same, and writes the same
    saved = ModelSpec(d_model=8, n_layers=1, heads=[2]).to_dict()
    assert "outputs" not in saved and saved["inputs"] == "tokens"
    assert ModelSpec.parse(saved) == ModelSpec(d_model=8, n_layers=1, heads=[2])


def test_a_language_model_head_needs_a_vocabulary():
    with pytest.raises(HeadwiseError) as exc:
        ModelSpec.parse(dict(inputs="vectors", outputs="lm", d_model=8, n_layers=1, heads=[2]), source="spec")
    assert "outputs = 'lm' needs token inputs" in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(HeadwiseError, match="outputs"):
        ModelSpec.parse(dict(outputs="classes", d_model=8, n_layers=1, heads=[2]))


class _MeanPoolClassifier(OutputHead):
    """A head of the kind a later family adds: mean over positions, then 3 classes."""

    @staticmethod
    def build(spec, model):
        return {"classifier": nn.Linear(spec.d_model, 3)}

    @staticmethod
    def forward(model, x, pad_vocab, key_mask=None):
        return model.classifier(x.mean(dim=1))


def test_a_registered_head_is_all_a_new_family_adds(monkeypatch):
    # Its declaration and its model code, registered as a family's model module registers them
    # (here into the registries' tables, so that the test leaves them as they were).
    monkeypatch.setitem(OUTPUT_HEAD_PARTS._items, "mean_classes",
                        OutputHeadPart(param_counts=lambda spec: {"classifier": spec.d_model * 3 + 3}))
    monkeypatch.setitem(OUTPUT_HEADS._items, "mean_classes", _MeanPoolClassifier)
    spec = ModelSpec(vocab_size=30, d_model=8, n_layers=2, heads=[2, 1], outputs="mean_classes")
    model = Transformer(spec)
    assert model(torch.randint(0, 30, (4, 6))).shape == (4, 3)
    assert count_params(spec) == model.num_params() and param_breakdown(spec)["classifier"] == 27
    assert "classifier.weight" in model.state_dict()


def test_too_long_input_is_a_value_error_not_a_cli_error():
    model = Transformer(ModelSpec(vocab_size=10, d_model=8, n_layers=1, heads=[2], max_seq_len=4))
    with pytest.raises(SequenceTooLong, match="sequence of 5 positions is longer than the model's max_seq_len 4"):
        model(torch.zeros(1, 5, dtype=torch.long))
    assert issubclass(SequenceTooLong, ValueError) and not issubclass(SequenceTooLong, HeadwiseError)
    cache = model.new_cache()
    model(torch.zeros(1, 3, dtype=torch.long), cache)
    with pytest.raises(SequenceTooLong, match="sequence of 5 positions"):
        model(torch.zeros(1, 2, dtype=torch.long), cache)
    vectors = Transformer(ModelSpec(vocab_size=None, d_model=8, n_layers=1, heads=[2], max_seq_len=4,
                                    positions="none"))
    with pytest.raises(SequenceTooLong):
        vectors(torch.zeros(1, 5, 8))


def test_a_class_token_model_trains_on_the_last_block_s_class_token_alone():
    """In training the last block computes only what the classifier reads: the same logits and
    gradients as the whole sequence (evaluation runs every position)."""
    spec = ModelSpec(inputs="images", image_size=8, patch_size=2, channels=3, num_classes=5, d_model=16,
                     n_layers=2, heads=[2, 4], causal=False, score_scale="inv_sqrt", qkv_bias=True)
    model = Transformer(spec).double()
    images = torch.randn(3, 3, 8, 8, dtype=torch.double)
    model.eval()
    reference = model(images)
    reference.sum().backward()
    full = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.train()
    seen = []
    hook = model.blocks[-1].attn.out.register_forward_pre_hook(lambda m, a: seen.append(a[0].shape[1]))
    logits = model(images)
    hook.remove()
    assert seen == [1]  # the class token's row alone
    torch.testing.assert_close(logits, reference, rtol=0, atol=1e-12)
    logits.sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, full[name], rtol=0, atol=1e-12, msg=name)
    assert OUTPUT_HEADS["classes"].positions_read(spec.model_copy(update={"pooling": "mean"})) is None


def test_drop_path_changes_training_only_and_adds_no_weights():
    """Stochastic depth is a training-time draw: evaluation is the model without it, weight for
    weight, and training (on the class token alone in the last block) draws its masks from torch's
    generator."""
    spec = ModelSpec(inputs="images", image_size=8, patch_size=2, channels=3, num_classes=5, d_model=16,
                     n_layers=3, heads=[2, 4, 2], causal=False, score_scale="inv_sqrt", drop_path=0.5)
    model, plain = Transformer(spec), Transformer(spec.model_copy(update={"drop_path": None}))
    assert model.state_dict().keys() == plain.state_dict().keys()
    plain.load_state_dict(model.state_dict())
    images = torch.randn(64, 3, 8, 8)
    model.eval(), plain.eval()
    assert torch.equal(model(images), plain(images))
    model.train(), plain.train()
    torch.manual_seed(0)
    first = model(images)
    torch.manual_seed(0)
    assert torch.equal(model(images), first)  # the masks come from torch's generator
    # without drop path (and dropout) training computes what evaluation does; with it, not
    torch.testing.assert_close(plain(images), plain.eval()(images), rtol=0, atol=1e-6)
    assert not torch.allclose(first, plain(images), atol=1e-3)
