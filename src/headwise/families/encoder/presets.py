"""The encoder family's model presets: Crammed BERT at the paper's sizes and a tiny one for CPU studies."""

from __future__ import annotations

from headwise.presets import register_preset

# Crammed BERT (Geiping & Goldstein; cramming's config/arch/crammed-bert.yaml and
# architectures/crammed_bert.py, the model Leaner Transformers trained): a bidirectional pre-LN
# masked-LM encoder, no biases but the LayerNorms' (eps 1e-12), gated GELU 3,072 -> 1,536,
# 1/sqrt(head_dim) scores, scaled sinusoidal positions, a LayerNorm on the embeddings, a final
# LayerNorm and a tied decoder without bias or transform; 128 tokens of a 32,768 WordPiece
# vocabulary. cramming pretrains without dropout (dropout 0.1 is for fine-tuning).
_CRAMMED_BERT = dict(
    inputs="tokens", outputs="mlm", vocab_size=32768, max_seq_len=128, d_model=768, mlp_hidden=3072,
    activation="geglu", causal=False, score_scale="inv_sqrt", norm="layernorm_pre", layer_norm_eps=1e-12,
    positions="scaled_sinusoid", embedding_norm="layernorm", tie_embeddings=True, qkv_bias=False,
    out_bias=False, mlp_bias=False, init_std=0.02,
)

# Crammed BERT, 16 layers x 12 heads of 64: 119,589,889 parameters (the paper's 119M).
register_preset("crammed-bert", {**_CRAMMED_BERT, "n_layers": 16, "heads": [12] * 16})
# Leaner Transformers, Table 1: 10 layers x 24 heads of 32: 84,182,017 (the paper's 84M).
register_preset("crammed-bert-leaner", {**_CRAMMED_BERT, "n_layers": 10, "heads": [24] * 10})
# The same architecture small enough for CPU studies: 1,182,209 parameters.
register_preset("crammed-bert-tiny", {**_CRAMMED_BERT, "vocab_size": 4096, "d_model": 128, "mlp_hidden": 512,
                                      "n_layers": 4, "heads": [4] * 4})
