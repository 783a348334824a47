"""The vision family's model presets: ViTs, from the paper's ViT-B/16 to small ones for CPU studies."""

from __future__ import annotations

from headwise.families.vision.timm_presets import PRESETS as TIMM_PRESETS
from headwise.presets import register_preset

# ViT (Dosovitskiy et al.; DeiT's training recipe): bidirectional pre-LN blocks, exact GELU, 1/sqrt
# scores, biased q/k/v, LayerNorm eps 1e-6, class-token pooling. A task's data sets image_size,
# channels and num_classes where they differ.
_VIT = dict(
    inputs="images", activation="gelu", causal=False, score_scale="inv_sqrt", qkv_bias=True,
    layer_norm_eps=1e-6, pooling="cls", positions="learned",
)

# ViT-B/16 at 224 px with 1,000 classes: 86,567,656 parameters (Leaner Transformers, Table 4).
register_preset("vit-b16", {**_VIT, "image_size": 224, "patch_size": 16, "channels": 3, "num_classes": 1000,
                            "d_model": 768, "n_layers": 12, "heads": [12] * 12, "mlp_ratio": 4.0})
# Leaner's reduced ViT-B: 7 layers of 16 heads at head_dim 64 (attention 1,024 wide), MLP 1,536:
# 40,112,872 parameters (the paper: 40.1M).
register_preset("vit-leaner-7x16", {**_VIT, "image_size": 224, "patch_size": 16, "channels": 3, "num_classes": 1000,
                                    "d_model": 768, "n_layers": 7, "heads": [16] * 7, "head_dim": 64,
                                    "mlp_ratio": 2.0})
# Small ViTs for CPU studies: 28 px grayscale (MNIST, Fashion-MNIST) and 32 px colour (CIFAR),
# patch 4 (49 and 64 patches).
register_preset("vit-tiny-28", {**_VIT, "image_size": 28, "patch_size": 4, "channels": 1, "num_classes": 10,
                                "d_model": 64, "n_layers": 4, "heads": [4] * 4, "mlp_ratio": 4.0})
register_preset("vit-small-32", {**_VIT, "image_size": 32, "patch_size": 4, "channels": 3, "num_classes": 10,
                                 "d_model": 192, "n_layers": 6, "heads": [3] * 6, "mlp_ratio": 4.0})

# Leaner's Tables 4-5 on timm, each original and reduced ([model] preset = "timm-xcit-m-reduced"):
# the model is timm's, with the changes the paper's counts point to (families/vision/timm_presets.py).
for _preset in TIMM_PRESETS:
    register_preset(_preset.name, _preset.model_table())
