"""headwise against Apple's OpenELM: layer-wise scaling (per-layer query and key/value heads and
FFN widths), the ``openelm-270m`` preset's exact parameter count, and logits and KV-cached greedy
generation against an OpenELM model on random weights copied one to one (within 1e-5 in float32).

OpenELM is remote code (corenet's ``general_gpt``, the hub's ``modeling_openelm.py``), not part of
``transformers``, and corenet is not importable here. The reference below is therefore an
independent re-implementation, written for this test from corenet's ``GPTConfig.__post_init__``,
``MultiHeadCausalAttention``, ``FeedForwardNetwork``, ``TransformerDecoderLayer`` and
``make_divisible`` (apple/corenet, ``corenet/modeling/models/language_modeling/general_gpt.py``):
its own rounding (with numpy's ``linspace``), its own fused ``qkv_proj`` / ``proj_1`` layouts and
module names, its own KV cache (keys cached after ``k_norm`` and before RoPE, the whole key
sequence rotated at every step, as OpenELM does). It shares no code with headwise.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headwise.cli import main
from headwise.errors import HeadwiseError
from headwise.hf.openelm import from_openelm, incompatibility, spec_from_config, to_config, to_state_dict
from headwise.params import count_params
from headwise.plans import layerwise_scaling, plan_heads
from headwise.presets import spec_from_preset
from headwise.spec import ModelSpec
from headwise.train.generate import generate
from helpers import one_thread  # noqa: F401  (one torch thread for this module)

# corenet's gpt_configs for the four OpenELM sizes (shared fields: num_gqa_groups 4,
# ffn_multipliers (0.5, 4.0), qkv_multipliers (0.5, 1.0), ffn_dim_divisor 256)
OPENELM_SIZES = {"270M": (16, 1280, 64), "450M": (20, 1536, 64), "1_1B": (28, 2048, 64), "3B": (36, 3072, 128)}


def _make_divisible(v: float, divisor: int) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


def reference_shapes(cfg: dict) -> dict:
    """OpenELM's per-layer query heads, KV heads and FFN inner widths for a corenet-style config."""
    n, d, hd, g = cfg["num_transformer_layers"], cfg["model_dim"], cfg["head_dim"], cfg["num_gqa_groups"]
    qkv = [round(v, 2) for v in np.linspace(*cfg["qkv_multipliers"], num=n, dtype=float)]
    ffn = [round(v, 2) for v in np.linspace(*cfg["ffn_multipliers"], num=n, dtype=float)]
    q = [int(_make_divisible(d * m, hd * g)) // hd for m in qkv]
    return {"q": q, "kv": [h // g for h in q], "ffn": [int(_make_divisible(m * d, cfg["ffn_dim_divisor"]))
                                                      for m in ffn]}


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(n))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def _rope(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    dim = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    ang = positions.float()[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    half1, half2 = x.float().chunk(2, dim=-1)
    return (x.float() * emb.cos() + torch.cat([-half2, half1], dim=-1) * emb.sin()).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: dict, q: int, kv: int) -> None:
        super().__init__()
        d, self.hd, self.q, self.kv, self.theta = cfg["model_dim"], cfg["head_dim"], q, kv, cfg["rope_freq_constant"]
        self.qkv_proj = nn.Linear(d, (q + 2 * kv) * self.hd, bias=False)
        self.q_norm, self.k_norm = RMSNorm(self.hd), RMSNorm(self.hd)
        self.out_proj = nn.Linear(q * self.hd, d, bias=False)

    def forward(self, x: Tensor, past: tuple[Tensor, Tensor] | None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        b, t, _ = x.shape
        qkv = self.qkv_proj(x).reshape(b, t, self.q + 2 * self.kv, self.hd).transpose(1, 2)
        queries, keys, values = qkv.split([self.q, self.kv, self.kv], dim=1)
        queries, keys = self.q_norm(queries), self.k_norm(keys)
        if past is not None:
            keys, values = torch.cat([past[0], keys], dim=-2), torch.cat([past[1], values], dim=-2)
        cache = (keys, values)
        s = keys.shape[-2]
        queries = _rope(queries, torch.arange(s - t, s), self.theta)
        keys = _rope(keys, torch.arange(s), self.theta)
        keys = keys.repeat_interleave(self.q // self.kv, dim=1)
        values = values.repeat_interleave(self.q // self.kv, dim=1)
        y = F.scaled_dot_product_attention(queries, keys, values, is_causal=past is None)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, self.q * self.hd)), cache


class FFN(nn.Module):
    def __init__(self, d: int, inner: int) -> None:
        super().__init__()
        self.proj_1, self.proj_2 = nn.Linear(d, 2 * inner, bias=False), nn.Linear(inner, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        y_1, y_2 = self.proj_1(x).chunk(2, dim=-1)
        return self.proj_2(F.silu(y_1) * y_2)


class Layer(nn.Module):
    def __init__(self, cfg: dict, q: int, kv: int, inner: int) -> None:
        super().__init__()
        self.attn, self.ffn = Attention(cfg, q, kv), FFN(cfg["model_dim"], inner)
        self.attn_norm, self.ffn_norm = RMSNorm(cfg["model_dim"]), RMSNorm(cfg["model_dim"])

    def forward(self, x: Tensor, past: tuple[Tensor, Tensor] | None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        y, cache = self.attn(self.attn_norm(x), past)
        x = x + y
        return x + self.ffn(self.ffn_norm(x)), cache


class OpenELM(nn.Module):
    """OpenELM with a tied output layer (``share_input_output_layers``), corenet's module names."""

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        shapes = reference_shapes(cfg)
        self.token_embeddings = nn.Embedding(cfg["vocab_size"], cfg["model_dim"])
        self.layers = nn.ModuleList(Layer(cfg, q, kv, f) for q, kv, f in zip(shapes["q"], shapes["kv"],
                                                                             shapes["ffn"]))
        self.norm = RMSNorm(cfg["model_dim"])

    def forward(self, ids: Tensor, past: list | None = None) -> tuple[Tensor, list]:
        x, caches = self.token_embeddings(ids), []
        for i, layer in enumerate(self.layers):
            x, cache = layer(x, None if past is None else past[i])
            caches.append(cache)
        return F.linear(self.norm(x), self.token_embeddings.weight), caches

    @torch.no_grad()
    def greedy(self, prompt: list[int], n: int) -> list[int]:
        logits, past = self(torch.tensor([prompt]))
        out = []
        for _ in range(n):
            out.append(int(logits[0, -1].argmax()))
            logits, past = self(torch.tensor([[out[-1]]]), past)
        return out


VOCAB = 97
#: 4 layers of width 64, 16-wide heads, query-width multipliers 0.5 -> 1.5 in 2 GQA groups, FFN
#: multipliers 0.5 -> 4.0 rounded to multiples of 16: query heads 2, 4, 6, 6 (the third rounded up, the
#: 10% rule of make_divisible), KV heads 1, 2, 3, 3
SMALL = dict(num_transformer_layers=4, model_dim=64, head_dim=16, num_gqa_groups=2, qkv_multipliers=(0.5, 1.5),
             ffn_multipliers=(0.5, 4.0), ffn_dim_divisor=16, vocab_size=VOCAB, max_context_length=64,
             share_input_output_layers=True, rope_freq_constant=10000)


def _reference() -> OpenELM:
    torch.manual_seed(0)
    ref = OpenELM(SMALL).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in ref.parameters():  # every weight moved, the norms' ones too
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return ref


@pytest.mark.parametrize("size", list(OPENELM_SIZES))
def test_layerwise_scaling_is_openelms(size):
    n, d, hd = OPENELM_SIZES[size]
    ref = reference_shapes(dict(num_transformer_layers=n, model_dim=d, head_dim=hd, num_gqa_groups=4,
                                qkv_multipliers=(0.5, 1.0), ffn_multipliers=(0.5, 4.0), ffn_dim_divisor=256))
    ours = layerwise_scaling(n, d, hd)
    assert list(ours.heads) == ref["q"] and list(ours.kv_heads) == ref["kv"]
    assert list(ours.mlp_hidden) == [2 * f for f in ref["ffn"]]


def test_openelm_270m_shape_and_exact_parameter_count():
    spec = spec_from_preset("openelm-270m")
    assert spec.heads[0] == 12 and spec.heads[-1] == 20 and spec.heads == [12] * 5 + [16] * 7 + [20] * 4
    assert spec.kv_heads_per_layer == [h // 4 for h in spec.heads]
    # OpenELM's own count: tied embeddings, per layer the fused qkv_proj, out_proj, the fused
    # proj_1 (value and gate) and proj_2, two norms of d_model and the q/k norms of head_dim; a final norm
    shapes = reference_shapes(dict(num_transformer_layers=16, model_dim=1280, head_dim=64, num_gqa_groups=4,
                                   qkv_multipliers=(0.5, 1.0), ffn_multipliers=(0.5, 4.0), ffn_dim_divisor=256))
    d, hd = 1280, 64
    expected = 32000 * d + d + sum((q + 2 * kv) * hd * d + q * hd * d + 2 * f * d + f * d + 2 * d + 2 * hd
                                   for q, kv, f in zip(shapes["q"], shapes["kv"], shapes["ffn"]))
    assert count_params(spec) == expected == 271_527_168


def test_plan_prints_openelm_270m(capsys):
    assert main(["plan", "--scheme", "layerwise", "--layers", "16", "--d-model", "1280", "--head-dim", "64",
                 "--vocab-size", "32000"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0].isdigit()]
    assert [int(r[1]) for r in rows] == [12] * 5 + [16] * 7 + [20] * 4
    assert [int(r[2]) for r in rows] == [3] * 5 + [4] * 7 + [5] * 4
    assert [int(r[5]) // 2 for r in rows] == reference_shapes(dict(
        num_transformer_layers=16, model_dim=1280, head_dim=64, num_gqa_groups=4, qkv_multipliers=(0.5, 1.0),
        ffn_multipliers=(0.5, 4.0), ffn_dim_divisor=256))["ffn"]
    assert "parameters 271,527,168" in out


def test_layerwise_plan_flags_and_refusals():
    plan = plan_heads("layerwise", 4, 64, head_dim=16,
                      layerwise=dict(qkv_multipliers=(0.5, 1.5), gqa_groups=2, ffn_divisor=16))
    assert plan.heads == (2, 4, 6, 6) and plan.kv_heads == (1, 2, 3, 3)
    assert type(plan).from_dict(plan.to_dict()) == plan
    assert "kv_heads" not in plan_heads("constant", 4, 64, 8).to_dict()  # other schemes' dicts unchanged
    with pytest.raises(HeadwiseError, match="head_dim"):
        plan_heads("layerwise", 4, 64)
    with pytest.raises(HeadwiseError, match="budget"):
        plan_heads("layerwise", 4, 64, 16, head_dim=16)
    assert main(["plan", "--scheme", "constant", "--total-heads", "8", "--gqa-groups", "2"]) == 2
    assert main(["plan", "--scheme", "layerwise", "--head-dim", "16", "--kv-heads", "2"]) == 2


def test_logits_match_openelm():
    ref = _reference()
    ours = from_openelm(ref, SMALL, prefix="")
    assert ours.spec.heads == [2, 4, 6, 6] and ours.spec.kv_heads_per_layer == [1, 2, 3, 3]
    x = torch.randint(0, VOCAB, (3, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        diff = (ours(x) - ref(x)[0]).abs().max().item()
    print(f"openelm: max |logits diff| {diff:.3g}")
    assert diff < 1e-5
    assert count_params(ours.spec) == ours.num_params() == sum(p.numel() for p in ref.parameters())
    # and back: the state dict headwise writes is the reference's, weight for weight
    theirs = ref.state_dict()
    back = to_state_dict(ours, prefix="")
    assert set(back) == set(theirs) and all(torch.equal(back[k], theirs[k]) for k in back)


def test_cached_greedy_generation_matches_openelm():
    ref = _reference()
    ours = from_openelm(ref, SMALL, prefix="")
    distinct = []
    for prompt in ([5, 17, 42, 8, 3], [1, 2, 3]):
        expected = ref.greedy(prompt, 30)
        assert generate(ours, prompt, 30, temperature=0) == generate(ours, prompt, 30, temperature=0,
                                                                      use_cache=False) == expected
        distinct.append(len(set(expected)))
    assert max(distinct) > 3


def test_config_round_trip_and_refusals():
    spec = spec_from_config(SMALL)
    again = spec_from_config(to_config(spec))
    assert again.layers() == spec.layers() and count_params(again) == count_params(spec)
    assert "qk_norm" in incompatibility(ModelSpec(**{**spec.model_dump(), "qk_norm": None}))
    llama = spec_from_preset("llama-tiny")
    assert "q and k" in incompatibility(llama)


def test_a_run_config_asks_for_layerwise_scaling():
    from headwise.tasks.base import TaskShape
    from headwise.train.config import ModelConfig, resolve_spec

    shape = TaskShape(inputs="tokens", outputs="lm", vocab_size=32000, seq_len=256)
    spec, plan = resolve_spec(ModelConfig.parse({"preset": "openelm-270m", "plan": {"scheme": "layerwise"}}), shape)
    assert spec.layers() == spec_from_preset("openelm-270m").layers() and plan.kv_heads == tuple(spec.kv_heads)
    small = {"preset": "llama-tiny", "n_layers": 4, "d_model": 64, "head_dim": 16, "kv_heads": None,
             "mlp_hidden": None, "plan": {"scheme": "layerwise", "qkv_multipliers": [0.5, 1.5], "gqa_groups": 2,
                                          "ffn_divisor": 16}}
    spec, _ = resolve_spec(ModelConfig.parse(small), TaskShape("tokens", "lm", 97, 64))
    assert spec.heads == [2, 4, 6, 6] and spec.kv_heads_per_layer == [1, 2, 3, 3]
    assert [s.mlp_hidden // 2 for s in spec.layers()] == reference_shapes(SMALL)["ffn"]
    # a saved run config keeps the plan's KV heads and MLP widths beside it: equal ones resolve again
    saved = {**small, "kv_heads": [1, 2, 3, 3], "mlp_hidden": [s.mlp_hidden for s in spec.layers()]}
    assert resolve_spec(ModelConfig.parse(saved), TaskShape("tokens", "lm", 97, 64))[0].layers() == spec.layers()
    with pytest.raises(HeadwiseError, match="kv_heads .* differ from the layerwise plan"):
        resolve_spec(ModelConfig.parse({**saved, "kv_heads": [1, 1, 1, 1]}), TaskShape("tokens", "lm", 97, 64))
    with pytest.raises(HeadwiseError, match="applies only to scheme 'layerwise'"):
        resolve_spec(ModelConfig.parse({**small, "plan": {"scheme": "constant", "total_heads": 8, "gqa_groups": 2}}),
                     TaskShape("tokens", "lm", 97, 64))


def test_the_hubs_config_json_reads_as_the_preset():
    # the hub's config.json lists every layer's heads and FFN multipliers (the rounded ramp)
    hub = dict(num_transformer_layers=16, model_dim=1280, head_dim=64, num_gqa_groups=4, ffn_dim_divisor=256,
               num_query_heads=[12] * 5 + [16] * 7 + [20] * 4, num_kv_heads=[3] * 5 + [4] * 7 + [5] * 4,
               ffn_multipliers=[round(v, 2) for v in np.linspace(0.5, 4.0, 16)], qkv_multipliers=[0.5, 1.0],
               vocab_size=32000, max_context_length=2048, share_input_output_layers=True, rope_freq_constant=10000,
               normalize_qk_projections=True, ffn_with_glu=True, activation_fn_name="swish",
               normalization_layer_name="rms_norm", model_type="openelm")
    assert spec_from_config(hub).layers() == spec_from_preset("openelm-270m").layers()
    assert count_params(spec_from_config(hub)) == 271_527_168
