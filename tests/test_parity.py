"""headwise against every architecture it converts to and from, one row of a table each: GPT-Neo,
ViT, Llama, Qwen3 and Laguna (``transformers``' own classes) and OpenELM (remote code, so an
independent re-implementation: tests/parity_openelm.py). Every row runs the same checks on random
weights in float32: logits (and the reference's own loss) within 1e-5 and the same parameter
count, the same gradients, the same greedy tokens as the reference's cached generation (with and
without headwise's KV cache), the weights and the config round trip both ways, and the specs and
configs a converter cannot express refused with the reason."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from headwise.errors import HeadwiseError
from headwise.hf import gpt_neo, laguna, llama, openelm, vit
from headwise.hf.architectures import architectures
from headwise.hf.convert import Architecture
from headwise.model import Transformer
from headwise.model.attention import ATTENTION_KINDS
from headwise.params import count_params
from headwise.presets import spec_from_preset
from headwise.spec import ModelSpec
from headwise.train.generate import generate
from decoder_parity import perturbed
from helpers import one_thread  # noqa: F401  (one torch thread for this module)
from parity_openelm import CONFIGS as OPENELM_CONFIGS, SMALL, OpenELM

transformers = pytest.importorskip("transformers", reason="transformers is the parity reference (pip install .[dev])")


@dataclass(frozen=True)
class Row:
    """One architecture of the registry (:func:`headwise.hf.architectures.architectures`): the specs
    compared and refused."""

    arch: Architecture
    cases: dict[str, ModelSpec]
    #: specs it cannot express, each with a word of the reason
    refusals: list[tuple[ModelSpec, str]]
    #: configs headwise cannot read, each made by a function, with a word of the reason
    config_refusals: list[tuple[Callable[[], Any], str]] = field(default_factory=list)
    #: the reference's attention implementations, each compared ("": its default)
    variants: tuple[str, ...] = ("",)
    #: the spread of the random weights (smaller where the scores are not scaled: GPT-Neo)
    scale: float = 0.3

    def to_theirs(self, model: Transformer, variant: str) -> torch.nn.Module:
        """The reference model with exactly ``model``'s weights, in eval mode."""
        hf = self.arch.to_hf(model, variant or None)
        assert not variant or hf.config._attn_implementation == variant  # the implementation asked for
        return hf

    def from_theirs(self, theirs: torch.nn.Module) -> Transformer:
        return self.arch.from_hf(theirs)

    def build(self, spec: ModelSpec, variant: str) -> torch.nn.Module:
        """A reference model of ``spec`` with its own random initialisation, in eval mode."""
        hf = getattr(transformers, self.arch.model_class)(self.arch.to_config(spec))
        if variant:
            hf.set_attn_implementation(variant)
        return hf.eval()

    def forward(self, theirs: torch.nn.Module, x: torch.Tensor, labels: torch.Tensor | None) -> tuple:
        """The reference's logits, and its own loss on ``labels`` (None where it computes none)."""
        out = theirs(x, labels=labels)
        return out.logits, out.loss

    def greedy(self, theirs: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
        """The reference's ``n`` greedy tokens after ``prompt``, generated with its KV cache."""
        theirs.generation_config.eos_token_id = None  # greedy to the end, never stopped early
        theirs.generation_config.pad_token_id = 0
        with torch.no_grad():
            out = theirs.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, use_cache=True)
        return out[0, len(prompt):].tolist()


@dataclass(frozen=True)
class OpenELMRow(Row):
    """OpenELM is remote code: its reference (tests/parity_openelm.py) reads corenet's config and
    state dict, and each case is the spec headwise reads from one of corenet's configs."""

    configs: dict[str, dict] = field(default_factory=dict)

    def config(self, spec: ModelSpec) -> dict:
        """The corenet config of the case ``spec``."""
        return self.configs[next(name for name, case in self.cases.items() if case == spec)]

    def to_theirs(self, model: Transformer, variant: str) -> torch.nn.Module:
        state = openelm.to_state_dict(model, prefix="")  # first: it refuses what OpenELM cannot express
        ref = OpenELM(self.config(model.spec)).eval()
        ref.load_state_dict(state)  # strict: the reference's every name and shape
        return ref

    def from_theirs(self, theirs: torch.nn.Module) -> Transformer:
        return openelm.from_openelm(theirs, theirs.cfg, prefix="")

    def build(self, spec: ModelSpec, variant: str) -> torch.nn.Module:
        return OpenELM(self.config(spec)).eval()

    def forward(self, theirs: torch.nn.Module, x: torch.Tensor, labels: torch.Tensor | None) -> tuple:
        return theirs(x)[0], None

    def greedy(self, theirs: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
        return theirs.greedy(prompt, n)


def _laguna_moe() -> Any:
    config = laguna.LAGUNA.to_config(ModelSpec(**LAGUNA_STYLE))
    config.mlp_layer_types = ["dense", "sparse", "sparse"]
    return config


def _laguna_two_ropes() -> Any:
    config = laguna.LAGUNA.to_config(ModelSpec(**{**LAGUNA_STYLE, "attention": ["local", "global", "global"], "window": 4}))
    config.rope_parameters["sliding_attention"]["partial_rotary_factor"] = 0.5
    return config


GPT_NEO = Row(
    gpt_neo.GPT_NEO,
    {name: spec_from_preset("blog-gpt-neo", vocab_size=97, max_seq_len=64, **fields) for name, fields in {
        # window 8 < T = 40: local layers really cut off keys
        "glgl-window8": dict(d_model=32, n_layers=4, heads=[4] * 4, attention=["global", "local"] * 2, window=8),
        "all-local-window1": dict(d_model=24, n_layers=2, heads=[3] * 2, attention=["local"] * 2, window=1),
        "one-head-gelu": dict(d_model=16, n_layers=3, heads=[1] * 3, activation="gelu", attention=None),
        "16-heads-relu-untied-mlp40": dict(d_model=32, n_layers=2, heads=[16] * 2, activation="relu",
                                           tie_embeddings=False, mlp_hidden=40, attention=["local", "global"]),
    }.items()},
    [(ModelSpec(vocab_size=50, d_model=32, n_layers=2, **fields), needle) for fields, needle in [
        (dict(heads=[4, 2]), "different head counts"),
        (dict(heads=[4, 4], head_dim=16), "decoupled"),
        (dict(heads=[4, 4], score_scale="inv_sqrt"), "score_scale"),
        (dict(heads=[4, 4], norm="unitnorm_post"), "norm"),
    ]],
    scale=0.1,
)
VIT_SMALL = dict(image_size=16, patch_size=4, channels=3, num_classes=7)
VIT = Row(
    vit.VIT,
    {name: spec_from_preset(preset, **fields) for name, (preset, fields) in {
        "tiny-28-preset": ("vit-tiny-28", {}),
        "2-layer-12-heads": ("vit-small-32", dict(d_model=48, n_layers=2, heads=[12] * 2, mlp_hidden=96)),
        "grey-patch2-no-qkv-bias": ("vit-tiny-28", dict(d_model=32, n_layers=3, heads=[2] * 3, mlp_hidden=40,
                                                        image_size=8, patch_size=2, qkv_bias=False)),
        "colour-patch8-one-head": ("vit-small-32", dict(d_model=24, n_layers=1, heads=[1], mlp_hidden=64, patch_size=8,
                                                        num_classes=3)),
        "rgb-16px-gelu_new-eps1e-5": ("vit-small-32", dict(**VIT_SMALL, d_model=64, n_layers=2, heads=[8] * 2,
                                                           mlp_hidden=128, activation="gelu_new", layer_norm_eps=1e-5)),
        "relu-head-dim-6": ("vit-small-32", dict(**VIT_SMALL, d_model=36, n_layers=2, heads=[6] * 2, mlp_hidden=50,
                                                 activation="relu")),
        # Leaner's shape in small: attention wider than d_model (ViTConfig.head_dim)
        "leaner-decoupled-head-dim": ("vit-leaner-7x16", dict(**VIT_SMALL, d_model=32, n_layers=2, heads=[4] * 2,
                                                              head_dim=16, mlp_hidden=48)),
    }.items()},
    [(spec_from_preset("vit-tiny-28", **{"d_model": 32, "n_layers": 2, "heads": [4, 4], **fields}), needle)
     for fields, needle in [
        (dict(pooling="mean"), "classifies the class token only"),
        (dict(heads=[4, 2]), "different head counts"),
        (dict(heads=[4, 4], head_dim=[8, 16]), "different head widths"),
        (dict(mlp_hidden=[32, 64]), "different MLP widths"),
        (dict(score_scale="none"), "score_scale"),
        (dict(norm="unitnorm_post"), "norm"),
        (dict(positions="none"), "positions"),
        (dict(out_bias=False), "out_bias"),
        (dict(mlp_bias=False), "mlp_bias"),
        (dict(classifier_hidden=16), "classifier is one linear map"),
        (dict(attention=["global", "nystrom"]), "it has nystrom attention layers"),
    ]] + [(ModelSpec(vocab_size=50, d_model=32, n_layers=2, heads=[4, 4]), "ViT reads images")],
    [(lambda: transformers.ViTConfig(hidden_act="silu", num_labels=3), "hidden_act"),
     (lambda: transformers.ViTConfig(image_size=[32, 16], patch_size=4, num_labels=3), "not square")],
    variants=("eager", "sdpa"), scale=0.1,
)
#: a small Llama: 3 layers of 4 query heads of 8 over d_model 32, SwiGLU 32 -> 48, RoPE, RMSNorm
LLAMA_STYLE = dict(vocab_size=97, d_model=32, n_layers=3, heads=[4] * 3, max_seq_len=64, mlp_hidden=96,
                   activation="swiglu", norm="rmsnorm_pre", layer_norm_eps=1e-6, positions="rope",
                   rope_theta=500.0, score_scale="inv_sqrt", qkv_bias=False, out_bias=False, mlp_bias=False)
LLAMA = Row(llama.LLAMA, {name: ModelSpec(**{**LLAMA_STYLE, **fields}) for name, fields in {
    "mha-tied": dict(),
    "gqa-4q-2kv-untied": dict(kv_heads=2, tie_embeddings=False),
    "mqa-wide-heads-biases": dict(kv_heads=1, head_dim=16, qkv_bias=True, out_bias=True, mlp_bias=True),
}.items()}, [(ModelSpec(**{**LLAMA_STYLE, **fields}), needle) for fields, needle in [
    (dict(heads=[4, 4, 2], head_dim=8), "different head counts"),
    (dict(kv_heads=[2, 2, 1]), "different key/value heads"),
    (dict(activation="geglu"), "activation"),
    (dict(positions="learned", rope_theta=10000.0), "positions"),
    (dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
    (dict(qk_norm="rmsnorm"), "qk_norm"),
    (dict(out_bias=True), "attention_bias"),
    (dict(attention=["global", "local", "global"]), "local"),
]])
QWEN3 = Row(llama.QWEN3, {name: ModelSpec(**{**LLAMA_STYLE, "kv_heads": 2, "qk_norm": "rmsnorm", **fields})
                                 for name, fields in {
    "gqa-qk-norm": dict(tie_embeddings=False),
    # window 6 < T: the sliding-window layer really cuts keys off, in the forward and when decoding
    "sliding-window": dict(attention=["global", "local", "global"], window=6),
}.items()}, [(ModelSpec(**LLAMA_STYLE), "qk_norm")])
#: a small Laguna: 3 layers of 8-wide heads over d_model 32, 2 KV heads, q/k norms, SwiGLU 32 -> 48
LAGUNA_STYLE = dict(vocab_size=97, d_model=32, n_layers=3, heads=[4, 6, 2], head_dim=8, kv_heads=2,
                    max_seq_len=64, mlp_hidden=96, activation="swiglu", norm="rmsnorm_pre", layer_norm_eps=1e-6,
                    positions="rope", rope_theta=500.0, score_scale="inv_sqrt", qk_norm="rmsnorm",
                    output_gate="softplus_head", qkv_bias=False, out_bias=False, mlp_bias=False)
LAGUNA = Row(
    laguna.LAGUNA,
    {name: ModelSpec(**{**LAGUNA_STYLE, **fields}) for name, fields in {
        "per-layer-query-heads-per-head-gate": dict(),
        "per-element-gate-untied-partial-rotary": dict(output_gate="softplus_element", tie_embeddings=False,
                                                       partial_rotary_factor=0.5),
        "mqa-biases": dict(kv_heads=1, heads=[2, 4, 3], qkv_bias=True, out_bias=True),
        # window 6 < T: the sliding-window layer really cuts keys off, in the forward and when decoding
        "sliding-window": dict(attention=["local", "global", "local"], window=6),
    }.items()},
    [(ModelSpec(**{**LAGUNA_STYLE, **fields}), needle) for fields, needle in [
        (dict(kv_heads=[2, 2, 1]), "different key/value heads"),
        (dict(head_dim=[8, 8, 4]), "different head widths"),
        (dict(output_gate=None), "output_gate = None"),
        (dict(qk_norm=None), "qk_norm"),
        (dict(mlp_bias=True), "mlp_bias"),
        (dict(out_bias=True), "attention_bias"),
        (dict(positions="learned", rope_theta=10000.0), "positions"),
    ]],
    [(_laguna_moe, r"layers \[1, 2\] are mixture-of-experts"), (_laguna_two_ropes, "different RoPE")],
)
OPENELM_SPEC = openelm.OPENELM.spec_from_config(SMALL)
OPENELM = OpenELMRow(
    openelm.OPENELM, {name: openelm.OPENELM.spec_from_config(c) for name, c in OPENELM_CONFIGS.items()},
    [(OPENELM_SPEC.model_copy(update={"qkv_bias": True}), "qkv_bias"),
     (spec_from_preset("llama-tiny", head_dim=[8, 8, 16, 16]), "different head widths")],
    configs=OPENELM_CONFIGS,
)
ROWS = [GPT_NEO, VIT, LLAMA, QWEN3, LAGUNA, OPENELM]


def _skip(row: Row) -> pytest.MarkDecorator:
    """Skip a row's tests where this transformers lacks its class (Laguna came in a later 5.x)."""
    missing = row.arch.model_class is not None and not hasattr(transformers, row.arch.model_class)
    return pytest.mark.skipif(missing, reason=f"this transformers has no {row.arch.model_class}")


CASES = [pytest.param(row, case, id=f"{row.arch.name}-{case}", marks=_skip(row)) for row in ROWS for case in row.cases]
DECODER_CASES = [p for p in CASES if p.values[0].cases[p.values[1]].output_head == "lm"]
REFUSALS = [pytest.param(row, spec, needle, id=f"{row.arch.name}-{needle}", marks=_skip(row))
            for row in ROWS for spec, needle in row.refusals]
CONFIG_REFUSALS = [pytest.param(row, make, needle, id=f"{row.arch.name}-{needle}", marks=_skip(row))
                   for row in ROWS for make, needle in row.config_refusals]
#: the per-layer fields of a spec, compared through its layers (written in more than one way)
PER_LAYER = {"heads", "head_dim", "kv_heads", "mlp_hidden", "mlp_ratio", "attention"}


def same_model(a: ModelSpec, b: ModelSpec) -> bool:
    """Equal specs up to how their per-layer fields are written (mlp_hidden 256 or mlp_ratio 4 at
    d 64; attention None or all "global")."""
    return a.layers() == b.layers() and a.model_dump(exclude=PER_LAYER) == b.model_dump(exclude=PER_LAYER)


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _ours(row: Row, spec: ModelSpec) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(spec).eval()
    perturbed(model, seed=1, scale=row.scale)
    return model


def _inputs(spec: ModelSpec, batch: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if spec.inputs == "images":
        return torch.randn(batch, spec.channels, spec.image_size, spec.image_size, generator=g)
    return torch.randint(0, spec.vocab_size, (batch, 40), generator=g)


def _labels(spec: ModelSpec, x: torch.Tensor) -> torch.Tensor:
    """What the reference's loss reads: the ids themselves (it shifts them), or a class per image."""
    return x if spec.output_head == "lm" else torch.arange(len(x)) % spec.num_classes


def _loss(spec: ModelSpec, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The reference's loss: next-token cross-entropy, or the classes'."""
    if spec.output_head == "lm":
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
    return F.cross_entropy(logits, labels)


@pytest.mark.parametrize(("row", "case"), CASES)
def test_logits_loss_and_counts_match(row, case):
    spec = row.cases[case]
    ours = _ours(row, spec)
    x = _inputs(spec, 3, seed=2)
    labels = _labels(spec, x)
    with torch.no_grad():
        mine = ours(x)
    for variant in row.variants:
        theirs = row.to_theirs(ours, variant)
        assert not theirs.training
        with torch.no_grad():
            logits, loss = row.forward(theirs, x, labels)
        diff = (mine - logits).abs().max().item()
        print(f"{row.arch.name}-{case} {variant}: max |logits diff| {diff:.3g}")
        assert mine.shape == logits.shape and diff < 1e-5
        if loss is not None:
            assert abs(_loss(spec, mine, labels).item() - loss.item()) < 1e-5
        assert count_params(spec) == ours.num_params() == sum(p.numel() for p in theirs.parameters())
        assert _same_weights(row.from_theirs(theirs), ours)  # and back, bit for bit


@pytest.mark.parametrize(("row", "case"), CASES)
def test_conversion_from_the_reference(row, case):
    spec = row.cases[case]
    x = _inputs(spec, 2, seed=4)
    for variant in row.variants:
        torch.manual_seed(0)
        theirs = row.build(spec, variant)
        perturbed(theirs, seed=3, scale=row.scale)
        ours = row.from_theirs(theirs)
        assert not ours.training and same_model(ours.spec, spec)
        with torch.no_grad():
            assert (ours(x) - row.forward(theirs, x, None)[0]).abs().max().item() < 1e-5
        assert _same_weights(row.to_theirs(ours, variant), theirs)  # and back, bit for bit


@pytest.mark.parametrize(("row", "case"), CASES)
def test_config_round_trips(row, case):
    spec = row.cases[case]
    config = row.arch.to_config(spec)
    assert same_model(row.arch.spec_from_config(config), spec)
    back = row.arch.to_config(row.arch.spec_from_config(config))
    assert back == config if isinstance(config, dict) else back.to_dict() == config.to_dict()


@pytest.mark.parametrize(("row", "case"), DECODER_CASES)
def test_cached_greedy_generation_matches(row, case):
    ours = _ours(row, row.cases[case])
    theirs = row.to_theirs(ours, row.variants[0])
    distinct = []
    for prompt in ([5, 17, 42, 8, 3], [1, 2, 3]):
        expected = row.greedy(theirs, prompt, 30)
        assert (generate(ours, prompt, 30, temperature=0) == generate(ours, prompt, 30, temperature=0, use_cache=False)
                == expected), prompt
        distinct.append(len(set(expected)))
    assert max(distinct) > 3  # not only a degenerate repetition (a random model falls into some)


@pytest.mark.parametrize(("row", "case"), CASES)
def test_training_gradients_match(row, case):
    # each weight's gradient is the reference's, laid out as headwise lays out the weight
    spec = row.cases[case]
    x = _inputs(spec, 2, seed=5)
    labels = _labels(spec, x)
    for variant in row.variants:
        ours = _ours(row, spec).train()
        theirs = row.to_theirs(ours, variant).train()
        _loss(spec, ours(x), labels).backward()
        logits, loss = row.forward(theirs, x, labels)
        (_loss(spec, logits, labels) if loss is None else loss).backward()
        with torch.no_grad():  # the reference's gradients in place of its weights, copied across as weights are
            for p in theirs.parameters():
                p.copy_(p.grad)
        grads = row.from_theirs(theirs)
        for (name, p), g in zip(ours.named_parameters(), grads.parameters(), strict=True):
            torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize(("row", "spec", "needle"), REFUSALS)
def test_what_a_converter_cannot_express_is_refused_with_the_reason(row, spec, needle):
    reason = row.arch.incompatibility(spec)
    assert needle in reason and "\n" not in reason
    with pytest.raises(HeadwiseError, match=f"cannot convert to {row.arch.label}") as err:
        row.to_theirs(Transformer(spec), row.variants[0])
    assert "\n" not in str(err.value)


def test_every_architecture_of_the_registry_has_a_row():
    assert {row.arch.name: row.arch for row in ROWS} == architectures()


#: the options of the attention kinds (a record maps those of its kinds, or refuses their layers)
KIND_OPTIONS = {option for _, kind in ATTENTION_KINDS.items() for option in kind.options}


def _away_from(default: Any) -> Any:
    """A value other than ``default``, of its kind (the check reads the field, not its validity)."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, (int, float)):
        return default + 1
    return f"{default}-other" if isinstance(default, str) else 7


@pytest.mark.parametrize("row", ROWS, ids=[row.arch.name for row in ROWS])
def test_every_spec_field_is_mapped_fixed_or_refused_away_from_its_default(row):
    # a new ModelSpec field is none of the record's: it must then be refused away from its
    # default, naming itself, in a spec the record otherwise expresses
    arch, spec = row.arch, next(iter(row.cases.values()))
    named = arch.maps | {f for f, _, _ in arch.fixed} | {f for f, _ in arch.uniform}
    assert named <= set(ModelSpec.model_fields), named - set(ModelSpec.model_fields)
    assert {f for f, _ in arch.uniform} <= arch.maps
    assert arch.incompatibility(spec) is None
    defaults = arch.at_default()
    assert not set(defaults) & named and "pad_id" in defaults
    for name in ModelSpec.model_fields:
        if name in defaults:
            default = ModelSpec.model_fields[name].default
            reason = arch.incompatibility(spec.model_copy(update={name: _away_from(default)}))
            assert reason is not None and reason.startswith(f"{name} = ") and arch.label in reason, (name, reason)
        else:  # mapped, fixed, what it reads or ends in, or an option of an attention kind
            assert name in named | {"inputs", "outputs"} | KIND_OPTIONS, name


@pytest.mark.parametrize(("row", "make", "needle"), CONFIG_REFUSALS)
def test_configs_headwise_cannot_read_are_refused(row, make, needle):
    with pytest.raises(HeadwiseError, match=needle):
        row.arch.spec_from_config(make())


def test_a_vit_config_round_trips_through_the_spec():
    config = transformers.ViTConfig(hidden_size=48, num_hidden_layers=3, num_attention_heads=6, intermediate_size=100,
                                    image_size=20, patch_size=5, num_channels=1, num_labels=4, qkv_bias=False,
                                    layer_norm_eps=1e-6, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    spec = vit.VIT.spec_from_config(config)
    assert spec.max_seq_len == 17 and spec.dropout == 0.1 and spec.layer(0).head_dim == 8
    back = vit.VIT.to_config(spec).to_dict()
    for key, value in config.to_dict().items():
        if key not in ("transformers_version", "architectures"):
            assert back[key] == value, key


def test_vit_b16_preset_counts_match_hf():
    spec = spec_from_preset("vit-b16")
    with torch.device("meta"):
        hf = transformers.ViTForImageClassification(vit.VIT.to_config(spec))
    assert count_params(spec) == sum(p.numel() for p in hf.parameters()) == 86_567_656
    assert same_model(vit.VIT.spec_from_config(hf.config), spec)
