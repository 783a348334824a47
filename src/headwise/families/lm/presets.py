"""The lm family's model presets: GPT-Neo and GPT-2 shaped causal language models."""

from __future__ import annotations

from headwise.presets import register_preset

_GPT_NEO = dict(
    vocab_size=50257, max_seq_len=2048, activation="gelu_new", window=256,
    score_scale="none", norm="layernorm_pre", positions="learned", tie_embeddings=True,
)

# The blog's model: GPT-Neo, d_model 768, 4 layers (68,514,048 parameters for any tied plan).
register_preset("blog-gpt-neo", {**_GPT_NEO, "d_model": 768, "n_layers": 4, "heads": [12] * 4,
                                 "attention": ["global", "local"] * 2})
# roneneldan/TinyStories-33M's architecture.
register_preset("tinystories-33m", {**_GPT_NEO, "d_model": 768, "n_layers": 4, "heads": [16] * 4,
                                    "attention": ["global", "local"] * 2})
# Leaner Transformers, Table 2: GPT-2 style baseline and the shallow, many-headed model.
register_preset("gpt2-12x12", {**_GPT_NEO, "d_model": 768, "n_layers": 12, "heads": [12] * 12, "max_seq_len": 1024,
                               "score_scale": "inv_sqrt"})
register_preset("leaner-4x16", {**_GPT_NEO, "d_model": 768, "n_layers": 4, "heads": [16] * 4, "max_seq_len": 1024,
                                "score_scale": "inv_sqrt"})
# A small LM for CPU studies (pair with a trained bpe:N tokenizer).
register_preset("tiny-lm", {**_GPT_NEO, "vocab_size": 4096, "d_model": 128, "n_layers": 4, "heads": [4] * 4,
                            "max_seq_len": 256, "attention": None, "score_scale": "inv_sqrt"})
