"""The lm family's model presets: GPT-Neo and GPT-2 shaped causal language models, and Llama-style ones."""

from __future__ import annotations

from headwise.plans import layerwise_scaling
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

# Llama-style blocks (the RoPE, RMSNorm, SwiGLU, bias-free block of transformers' LlamaForCausalLM,
# which headwise.hf.llama converts to exactly): every layer global, scores scaled by 1/sqrt(head_dim).
_LLAMA = dict(
    vocab_size=50257, max_seq_len=2048, activation="swiglu", norm="rmsnorm_pre", layer_norm_eps=1e-5,
    positions="rope", rope_theta=10000.0, score_scale="inv_sqrt", qkv_bias=False, out_bias=False, mlp_bias=False,
    tie_embeddings=True,
)
# The blog's model (d_model 768, 4 layers, 12 heads of 64, GPT-2's vocabulary, tied) with Llama
# blocks: a SwiGLU MLP 768 -> 2,048 (Llama's 8/3 d_model, a multiple of 256; mlp_hidden counts the
# value and gate halves), whose 4,718,592 weights per layer equal GPT-Neo's 768 -> 3,072 GELU MLP's.
# 66,915,840 parameters (count_params; the GPT-Neo blog model's 68,514,048 less its 1,572,864
# learned positions and its biases and LayerNorm shifts).
register_preset("blog-llama", {**_LLAMA, "d_model": 768, "n_layers": 4, "heads": [12] * 4, "mlp_hidden": 4096})
# A small Llama-style LM for CPU studies (pair with a trained bpe:N tokenizer): tiny-lm's shape
# with grouped-query attention, 4 query heads sharing 2 key/value heads in every layer, and a
# SwiGLU MLP 128 -> 352 (8/3 d_model rounded up to a multiple of 32). 1,262,720 parameters with its
# 4,096-token vocabulary.
register_preset("llama-tiny", {**_LLAMA, "vocab_size": 4096, "d_model": 128, "n_layers": 4, "heads": [4] * 4,
                               "kv_heads": 2, "mlp_hidden": 704, "max_seq_len": 256})

# Apple's OpenELM-270M (corenet's "OpenELM-270M" config; Mehta et al. 2024): 16 Llama-style layers
# of width 1,280 with 64-wide heads, layer-wise scaled (headwise.plans.layerwise_scaling, OpenELM's
# defaults: query-width multipliers 0.5 -> 1.0 over 4 GQA groups, SwiGLU multipliers 0.5 -> 4.0
# rounded to multiples of 256): query heads 12 -> 20, key/value heads 3 -> 5, SwiGLU inner widths
# 768 -> 5,120; RMS-normed q and k, RMSNorm eps 1e-6, RoPE theta 10,000, no biases, tied
# embeddings over Llama's 32,000-token vocabulary. 271,527,168 parameters.
_OPENELM_270M = layerwise_scaling(16, 1280, 64)
register_preset("openelm-270m", {**_LLAMA, "vocab_size": 32000, "d_model": 1280, "n_layers": 16, "head_dim": 64,
                                 "heads": list(_OPENELM_270M.heads), "kv_heads": list(_OPENELM_270M.kv_heads),
                                 "mlp_hidden": list(_OPENELM_270M.mlp_hidden), "qk_norm": "rmsnorm",
                                 "layer_norm_eps": 1e-6})
