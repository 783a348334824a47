"""ModelSpec validation, head plans and analytic parameter counts."""

import json
import random
import subprocess
import sys

import pytest

from headwise.cli import main
from headwise.errors import HeadwiseError
from headwise.model import Transformer
from headwise.params import count_params, flops_per_token, param_breakdown
from headwise.plans import Plan, Scheme, plan_heads
from headwise.presets import spec_from_preset
from headwise.spec import ModelSpec

BLOG_GRID = {
    ("descending", 180): [96, 48, 24, 12],
    ("ascending", 180): [12, 24, 48, 96],
    ("constant", 180): [48, 48, 48, 48],
    ("descending", 90): [48, 24, 12, 6],
    ("ascending", 90): [6, 12, 24, 48],
    ("constant", 90): [24, 24, 24, 24],
    ("descending", 45): [24, 12, 6, 3],
    ("ascending", 45): [3, 6, 12, 24],
    ("constant", 45): [12, 12, 12, 12],
}


@pytest.mark.parametrize("key,expected", list(BLOG_GRID.items()), ids=lambda v: str(v))
def test_blog_grid(key, expected):
    scheme, total = key
    plan = plan_heads(scheme, n_layers=4, d_model=768, total_heads=total)
    assert plan.heads == tuple(expected) and plan.scheme is Scheme(scheme)
    assert plan.head_dims == tuple(768 // h for h in expected) and plan.widths == (768,) * 4
    # constant cannot reach 45/90/180 exactly with divisors of 768: the plan must say so
    assert plan.exact == (scheme != "constant")
    assert bool(plan.notes) == (not plan.exact)


@pytest.mark.parametrize("heads", list(BLOG_GRID.values()))
def test_blog_model_has_68_5M_params_for_every_plan(heads):
    spec = spec_from_preset("blog-gpt-neo", heads=heads)
    assert count_params(spec) == 68_514_048
    assert Transformer(spec).num_params() == 68_514_048


def test_blog_breakdown_matches_gpt_neo_note():
    parts = param_breakdown(spec_from_preset("blog-gpt-neo"))
    assert parts["token_embedding"] == 38_597_376
    assert parts["position_embedding"] == 1_572_864
    assert parts["block_0"] == 7_085_568
    assert parts["final_norm"] == 1_536
    assert parts["lm_head"] == 0


def _random_spec(rng: random.Random) -> ModelSpec:
    n_layers = rng.randint(1, 4)
    d_model = rng.choice([8, 12, 16, 24])
    decoupled = rng.random() < 0.5
    heads = [rng.randint(1, 5) for _ in range(n_layers)] if decoupled else [
        rng.choice([h for h in (1, 2, 3, 4, 6, 8) if d_model % h == 0]) for _ in range(n_layers)]
    head_dim = None
    if decoupled:
        head_dim = rng.choice([rng.randint(1, 9), [rng.randint(1, 9) for _ in range(n_layers)]])
    vector = rng.random() < 0.25
    activation = rng.choice(["gelu_new", "geglu"])
    width = (lambda: 2 * rng.randint(1, 15)) if activation == "geglu" else (lambda: rng.randint(1, 30))
    return ModelSpec(
        vocab_size=None if vector else rng.randint(5, 40), d_model=d_model, n_layers=n_layers,
        max_seq_len=rng.randint(4, 32), heads=heads, head_dim=head_dim, activation=activation,
        mlp_hidden=rng.choice([None, width(), [width() for _ in range(n_layers)]]),
        embedding_norm=rng.choice([None, "layernorm"]),
        norm=rng.choice(["layernorm_pre", "unitnorm_post"]),
        positions=rng.choice(["learned", "none", "scaled_sinusoid"]),
        tie_embeddings=rng.random() < 0.5, qkv_bias=rng.random() < 0.5, out_bias=rng.random() < 0.5,
        mlp_bias=rng.random() < 0.5, causal=not vector,
    )


def test_analytic_count_equals_built_model_everywhere():
    rng = random.Random(0)
    for _ in range(200):
        spec = _random_spec(rng)
        assert count_params(spec) == Transformer(spec).num_params(), spec


def test_decoupled_head_dim_widens_attention():
    # Leaner Transformers' setting: head_dim 64 fixed, 16 heads -> attention width 1024 != d_model
    spec = spec_from_preset("leaner-4x16", head_dim=64)
    assert [s.width for s in spec.layers()] == [1024] * 4
    model = Transformer(spec)
    assert model.blocks[0].attn.qkv.weight.shape == (3 * 1024, 768)
    assert model.blocks[0].attn.out.weight.shape == (768, 1024)
    assert count_params(spec) == model.num_params()


def test_flops_per_token_closed_form():
    spec = spec_from_preset("blog-gpt-neo")
    n = 68_514_048 - 1_572_864  # positions are a lookup, not a matmul
    assert flops_per_token(spec, 512) == 6 * n + 12 * 4 * 768 * 512


@pytest.mark.parametrize("fields,needle", [
    (dict(heads=[5, 4, 4, 4]), "layer 0: heads = 5 does not divide d_model 768"),
    (dict(heads=[12, 12, 12]), "heads has 3 entries but n_layers is 4"),
    (dict(heads=[12, 0, 12, 12], head_dim=64), "layer 1: heads = 0"),
    (dict(window=0), "window"),
    (dict(d_model=-4), "d_model"),
    (dict(head_dim=[64, 64]), "head_dim has 2 entries"),
    (dict(activation="swish"), "activation"),
    (dict(attention=["global", "local", "sliding", "global"]), "attention"),
])
def test_invalid_specs_give_one_line(fields, needle):
    base = dict(d_model=768, n_layers=4, heads=[12] * 4)
    with pytest.raises(HeadwiseError) as exc:
        ModelSpec.parse({**base, **fields}, source="spec")
    assert needle in str(exc.value)
    assert "\n" not in str(exc.value)


def test_unknown_key_suggests():
    with pytest.raises(HeadwiseError, match="did you mean 'n_layers'"):
        ModelSpec.parse(dict(d_model=8, n_layer=2, heads=[1, 1]))


@pytest.mark.parametrize("kwargs,needle", [
    (dict(scheme="spiral", total_heads=8), "unknown scheme 'spiral'"),
    (dict(scheme="constant", total_heads=2), "at least 4"),
    (dict(scheme="explicit"), "needs the list"),
    (dict(scheme="explicit", heads=[7, 1, 1, 1]), "layer 0: heads = 7 does not divide"),
    (dict(scheme="descending", total_heads=60, ratio=0.5), "ratio"),
])
def test_invalid_plans(kwargs, needle):
    with pytest.raises(HeadwiseError, match=needle):
        plan_heads(n_layers=4, d_model=768, **kwargs)


def test_decoupled_plans_hit_totals_exactly():
    assert plan_heads("constant", 4, 768, 180, head_dim=64).heads == (45,) * 4
    plan = plan_heads("linear", 4, 768, 40, head_dim=64)
    assert plan.total == 40 and list(plan.heads) == sorted(plan.heads) and plan.head_dims == (64,) * 4


def test_plan_round_trips_through_its_dict():
    plan = plan_heads("constant", 4, 768, 180)
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert plan.to_dict()["total"] == 192 and plan.notes and not plan.exact
    with pytest.raises(AttributeError):
        plan.heads = (1, 1, 1, 1)  # a resolved plan is never changed in place


def test_cli_plan_json(capsys):
    assert main(["plan", "--d-model", "768", "--layers", "4", "--scheme", "descending",
                 "--total-heads", "180", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["heads"] == [96, 48, 24, 12]
    assert out["head_dims"] == [8, 16, 32, 64]
    assert out["total_heads"] == 180
    assert out["params"] == 68_514_048


def test_cli_plan_says_when_total_is_not_exact(capsys):
    assert main(["plan", "--scheme", "constant", "--total-heads", "180"]) == 0
    out = capsys.readouterr().out
    assert "48" in out and "requested 180" in out and "note:" in out


def test_cli_bad_plan_exits_2_without_traceback():
    proc = subprocess.run([sys.executable, "-m", "headwise", "plan", "--scheme", "explicit", "--heads", "5,4,4,4"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "layer 0" in proc.stderr


def test_a_budget_beyond_any_model_is_refused_in_one_line_rather_than_searched():
    # with free head widths every count is valid, and the nearest-plan search grows with the budget
    with pytest.raises(HeadwiseError, match=r"total_heads = 1,000,000; a scheme spreads at most 32,768 heads"):
        plan_heads("ascending", 4, 256, 1_000_000, head_dim=64)
