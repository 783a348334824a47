"""Attention kinds are plug-ins (headwise.model.attention): a kind written in a temporary module,
editing no headwise file, is checked by the spec, builds, trains, is counted exactly, analysed,
refused with the reason by the converters that lack it, and exported with its module to a folder
that loads where headwise is not importable. The built-in kinds keep the saved flat keys, and
checking a spec of them loads no torch and no family."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from headwise.errors import RunFailure
from headwise.hf.gpt_neo import GPT_NEO
from headwise.model.transformer import Transformer
from headwise.params import attention_flops, count_params, param_breakdown
from headwise.spec import ModelSpec
from tests.helpers import one_line_error, one_thread  # noqa: F401 - one_thread is a fixture

KIND_MODULE = '''
"""A toy attention kind: softmax attention with a learned gate on each head's output."""

import torch
from torch import nn

from headwise.model.attention import AttentionKind, Option, register_kind, softmax_attention


@register_kind
class GatedAttention(AttentionKind):
    name = "gated_toy"

    @staticmethod
    def params(spec, shape):
        return shape.heads

    @staticmethod
    def build(attn, spec, shape):
        attn.gate = nn.Parameter(torch.zeros(shape.heads))

    @staticmethod
    def forward(attn, q, k, v, cache, queries, key_mask):
        y = softmax_attention(attn, q, k, v, cache, queries, key_mask)
        return y * (2 * torch.sigmoid(attn.gate))[:, None, None]


@register_kind
class WideAttention(AttentionKind):
    """A kind with an option of its own, which only headwise.model's kinds may add."""

    name = "wide_toy"
    options = {"toy_width": Option(int, 2, "the toy's width")}
'''

#: a kind in a module whose file name is that of headwise.model.attention's
COLLIDING_MODULE = '''
from headwise.model.attention import AttentionKind, register_kind


@register_kind
class CollidingAttention(AttentionKind):
    name = "colliding_toy"
'''

BASE = dict(vocab_size=61, d_model=32, n_layers=2, heads=[2, 4], max_seq_len=24)


@pytest.fixture(scope="module")
def toy_kinds(tmp_path_factory):
    """Import the toy kinds from a temporary folder (their modules register them); yields it."""
    folder = tmp_path_factory.mktemp("kinds")
    (folder / "attention_gated_toy.py").write_text(KIND_MODULE, encoding="utf-8")
    (folder / "toy_package").mkdir()
    (folder / "toy_package" / "__init__.py").write_text("", encoding="utf-8")
    (folder / "toy_package" / "attention.py").write_text(COLLIDING_MODULE, encoding="utf-8")
    sys.path.insert(0, str(folder))
    try:
        __import__("attention_gated_toy")
        __import__("toy_package.attention")
        yield folder
    finally:
        sys.path.remove(str(folder))


def _gated_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelSpec(**BASE, attention=["global", "gated_toy"], init_std=0.3))


def test_a_kind_from_a_temporary_module_builds_trains_and_is_counted_exactly(toy_kinds):
    model = _gated_model()
    spec = model.spec
    assert [s.attention for s in spec.layers()] == ["global", "gated_toy"]
    assert model.blocks[1].attn.gate.shape == (4,) and not hasattr(model.blocks[0].attn, "gate")
    assert count_params(spec) == model.num_params() == sum(param_breakdown(spec).values())
    assert count_params(spec) == count_params(spec.model_copy(update={"attention": None})) + 4
    # the FLOPs it does not declare are softmax attention's
    assert attention_flops(spec, spec.layer(1), 10) == 6 * 2 * 10 * 10 * spec.layer(1).width

    ids = torch.randint(0, 61, (3, 16), generator=torch.Generator().manual_seed(1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = model.blocks[1].attn.gate.detach().clone()
    logits = model(ids)
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss) and not torch.equal(model.blocks[1].attn.gate, before)
    # the KV cache: decoding one position at a time gives what one forward gives
    model.eval()
    with torch.no_grad():
        cache = model.new_cache()
        steps = torch.cat([model(ids[:, i:i + 1], cache) for i in range(ids.shape[1])], dim=1)
        torch.testing.assert_close(steps, model(ids), atol=1e-4, rtol=0)


def test_analysis_and_the_converters_read_a_kind_through_its_declaration(toy_kinds):
    from headwise.analysis.conditioning import analyze_model

    model = _gated_model().eval()
    result = analyze_model(model, [torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(2))])
    assert [layer.attention for layer in result.layers] == ["global", "gated_toy"]
    uniform = model.spec.model_copy(update={"heads": [4, 4]})
    assert GPT_NEO.incompatibility(uniform) == "it has gated_toy attention layers; GPT-Neo's layers are global or local"


def test_unknown_kinds_are_one_line_errors_naming_the_choices(toy_kinds):
    message = one_line_error(ModelSpec.parse, {**BASE, "attention": "lokal"})
    assert "unknown attention kind 'lokal'; did you mean 'local'?" in message
    assert "gated_toy, global, local, nystrom" in message  # the temporary module's kind among them
    message = one_line_error(ModelSpec.parse, {**BASE, "attention": ["global", "wide_toy"]})
    assert "attention kind 'wide_toy' declares options toy_width, which ModelSpec does not have" in message


def test_the_kinds_own_checks_say_what_to_change():
    assert "local attention layers need causal = true" in one_line_error(
        ModelSpec.parse, {**BASE, "attention": "local", "causal": False})
    assert "nystrom attention layers are bidirectional: set causal = false" in one_line_error(
        ModelSpec.parse, {**BASE, "attention": "nystrom"})
    # an option's own check holds in any spec, as before the kinds moved into their modules
    assert "nystrom_conv = 4: the convolution's kernel must be odd" in one_line_error(
        ModelSpec.parse, {**BASE, "nystrom_conv": 4})


def test_saved_flat_keys_load_unchanged(tmp_path):
    defaults = {"window": 256, "landmarks": 64, "pinv_iterations": 6, "nystrom_conv": None, "pinv_init": "per_head"}
    assert {k: ModelSpec.model_fields[k].default for k in defaults} == defaults
    saved = tmp_path / "spec.toml"  # a [model] table as run configs have held it
    saved.write_text(textwrap.dedent("""
        vocab_size = 61
        d_model = 32
        n_layers = 2
        heads = [2, 4]
        attention = "nystrom"
        causal = false
        outputs = "classes"
        num_classes = 3
        window = 16
        landmarks = 8
        pinv_iterations = 3
        nystrom_conv = 5
        pinv_init = "original"
    """), encoding="utf-8")
    spec = ModelSpec.load(saved)
    assert (spec.window, spec.landmarks, spec.pinv_iterations, spec.nystrom_conv, spec.pinv_init) == \
        (16, 8, 3, 5, "original")
    assert [s.attention for s in spec.layers()] == ["nystrom", "nystrom"]
    model = Transformer(spec)
    attn = model.blocks[0].attn
    assert (attn.landmarks, attn.pinv_iterations, attn.pinv_init, attn.conv.kernel_size) == (8, 3, "original", 5)
    assert count_params(spec) == model.num_params()
    again = ModelSpec.parse(spec.to_dict())
    assert again == spec and again.to_dict() == spec.to_dict()


def test_checking_a_spec_of_built_in_kinds_loads_no_torch_and_no_family():
    script = textwrap.dedent("""
        import sys
        from headwise.spec import ModelSpec
        for kind, causal in (("global", True), ("local", True), ("nystrom", False)):
            ModelSpec.parse(dict(vocab_size=61, d_model=32, n_layers=2, heads=[2, 4], attention=kind, causal=causal))
        print(sorted(m for m in sys.modules if m == "torch" or m.startswith("headwise.families")))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


FRESH_PROCESS = textwrap.dedent("""
    import json, sys
    sys.modules["headwise"] = None  # headwise must not be importable here
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
    with torch.no_grad():
        print(json.dumps(model(torch.arange(20).view(1, 20) % 61).logits[0].tolist()))
""")


def test_an_exported_model_carries_its_kinds_module(toy_kinds, tmp_path):
    pytest.importorskip("transformers", reason="transformers (the hf extra) is not installed")
    from headwise.hf.export import bundled_sources, save_with_code

    model = _gated_model().eval()
    out = tmp_path / "export"
    save_with_code(model, out)
    assert (out / "attention_gated_toy.py").is_file() and (out / "registry.py").is_file()
    assert "from .attention_gated_toy import GatedAttention" in (out / "modeling_headwise.py").read_text()
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "PYTHONPATH": ""}
    result = subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(out)], capture_output=True, text=True,
                            cwd=tmp_path, env=env, timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    with torch.no_grad():
        expected = model(torch.arange(20).view(1, 20) % 61)[0]
    assert torch.equal(torch.tensor(json.loads(result.stdout.strip().splitlines()[-1])), expected)

    torch.manual_seed(0)
    colliding = Transformer(ModelSpec(**BASE, attention=["global", "colliding_toy"]))
    with pytest.raises(RunFailure, match=r"needs headwise\.model\.attention and toy_package\.attention, which would "
                                         r"both be attention\.py"):
        bundled_sources(colliding)
