"""The nearest family's model preset: Amsel et al.'s nearest-neighbour encoder."""

from __future__ import annotations

from headwise.presets import register_preset

# d = 64, rank per head chosen separately.
register_preset("amsel-nn", {"vocab_size": None, "d_model": 64, "n_layers": 1, "heads": [1], "head_dim": 64,
                             "max_seq_len": 256, "mlp_hidden": 2048, "activation": "relu", "causal": False,
                             "score_scale": "inv_sqrt", "norm": "unitnorm_post", "positions": "none"})
