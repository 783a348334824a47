"""Leaner Transformers' Tables 4 and 5 as timm model presets: 11 vision transformers, each original
and reduced (fewer layers, more heads), for ImageNet-1k (1,000 classes, 224 px, 3 channels).

Each preset is the timm model and the changes that the paper's Params column points to (the
authors trained with timm), with the row as the table prints it, the paper's count as printed, and
our exact count (a test holds it, so it cannot drift). Where no construction faithful to the row
gives the paper's count, or the count points away from a column, ``difference`` says which and why;
no architecture is bent to hit a number. Torch-free: counting and building are
:func:`preset_counts` and :func:`build_preset`, which load timm.

Head width, by the counts: held at the base model's for ViT-B/DeiT-B (64), ViT-L/DeiT-L (64; 1024
does not split over 30 heads) and XCiT-M's cross-covariance blocks (64); timm's ``dim // heads``
for XCiT-L, TNT-B, VOLO and DaViT, whose reduced counts match only that way.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields

from headwise.errors import HeadwiseError
from headwise.families.vision.timm_models import TimmChanges, build_timm_model, count_parameters


@dataclass(frozen=True)
class TimmPreset:
    """One configuration of Tables 4-5: ``model`` (a timm name) with ``changes``; the table's
    ``row`` as printed ("(Depth, Heads) MLP dim.") and its other columns as printed (Top-1 and
    Top-5 %, Params in millions, Memory in GB); our exact count, and where ours departs from the
    row or the paper's count, why."""

    name: str
    table: int
    model: str
    changes: TimmChanges
    row: str
    paper_top1: str
    paper_top5: str
    paper_params: str
    paper_memory_gb: str
    params: int
    difference: str = ""

    def construction(self) -> str:
        """``model changes``, as a listing prints it."""
        return f"{self.model} {self.changes.describe()}".rstrip()

    def model_table(self) -> dict[str, object]:
        """The preset as ``[model]`` holds it (a ``[model.timm]`` table): the model, its changes,
        and the paper's 224 px RGB images (ImageNet-1k's)."""
        changes = {f.name: list(v) if isinstance(v, tuple) else v for f in fields(self.changes)
                   if (v := getattr(self.changes, f.name)) is not None}
        return {"timm": {"name": self.model, **changes, "image_size": 224, "channels": 3}}


_NONE = TimmChanges()
_VIT_B_REDUCED = TimmChanges(depth=7, heads=16, mlp_ratio=2.0, head_dim=64)
_DEIT_L = TimmChanges(depth=24, heads=16, embed_dim=1024)
_VIT_L_COUNT = ("the paper's 203.6M is this model's count at 16 layers (203,556,840); the row, and "
                "ViT-L, have 24")
_VOLO_RATIO_3 = ("MLP ratio 3 ({mlp}), timm's {base}, whose count is the paper's; the row's MLP "
                 "dims are ratio {ratio} ({count})")

PRESETS: tuple[TimmPreset, ...] = (
    # Table 4: base models; the paper's columns as printed: top-1, top-5, params (M), memory (GB)
    TimmPreset("timm-vit-b", 4, "vit_base_patch16_224", _NONE,
               "(12, 12) 3072", "80.1", "94.2", "86.6", "178.4", 86_567_656),
    TimmPreset("timm-vit-b-reduced", 4, "vit_base_patch16_224", _VIT_B_REDUCED,
               "(7, 16) 1536", "80.4", "94.9", "40.1", "101.6", 40_112_872),
    # DeiT-B, not the distilled one (87.3M)
    TimmPreset("timm-deit-b", 4, "deit_base_patch16_224", _NONE,
               "(12, 12) 3072", "80.4", "95.1", "86.6", "178.4", 86_567_656),
    TimmPreset("timm-deit-b-reduced", 4, "deit_base_patch16_224", _VIT_B_REDUCED,
               "(7, 16) 1536", "80.8", "95.3", "40.1", "101.6", 40_112_872),
    TimmPreset("timm-xcit-m", 4, "xcit_medium_24_p16_224", _NONE,
               "(24, 8) 2048", "81.4", "95.5", "84.4", "320.8", 84_395_752),
    # head width 64 in the 12 XCA blocks; at timm's 32 the count is 46.4M
    TimmPreset("timm-xcit-m-reduced", 4, "xcit_medium_24_p16_224", TimmChanges(depth=12, heads=16, head_dim=64),
               "(12, 16) 2048", "81.7", "95.6", "59.0", "196", 59_002_600),
    TimmPreset("timm-tnt-b", 4, "tnt_b_patch16_224", _NONE,
               "(12, 10) 2560", "82.3", "95.7", "65.4", "266.4", 65_428_680),
    TimmPreset("timm-tnt-b-reduced", 4, "tnt_b_patch16_224", TimmChanges(depth=8, heads=16, mlp_ratio=2.0),
               "(8, 16) 2560", "82.3", "95.8", "30.9", "200.8", 30_897_800,
               "MLP 1280 (ratio 2), not the row's 2560: only 1280 gives the paper's 30.9M (2560 gives 44.0M, "
               "51.9M with head width held at 64), the halving the paper makes for ViT-B"),
    TimmPreset("timm-volo-d3", 4, "volo_d3_224", _NONE,
               "([8, 8, 16, 4], [8, 16, 16, 16]) (1024, 2048, 2048, 2048)", "82.6", "95.6", "86", "209.2", 86_325_072,
               _VOLO_RATIO_3.format(mlp="768, 1536, 1536, 1536", base="volo_d3_224", ratio=4, count="103.1M")),
    TimmPreset("timm-volo-d3-reduced", 4, "volo_d3_224", TimmChanges(depth=(4, 4, 8, 2), heads=(16, 32, 32, 32)),
               "([4, 4, 8, 2], [16, 32, 32, 32]) (768, 1536, 1536, 1536)", "82.6", "95.7", "47.5", "144.8",
               47_454_032),
    TimmPreset("timm-davit-b", 4, "davit_base", _NONE,
               "([1, 1, 9, 1], [4, 8, 16, 32]) (512, 1024, 2048, 4096)", "83.3", "96.0", "88.0", "294.4", 87_954_408),
    TimmPreset("timm-davit-b-reduced", 4, "davit_base", TimmChanges(depth=(1, 1, 5, 1), heads=(4, 8, 32, 32)),
               "([1, 1, 5, 1], [4, 8, 32, 32]) (512, 1024, 2048, 4096)", "83.5", "96.1", "62.0", "233.6", 62_653_416,
               "62.7M, not the paper's 62.0M: in timm's DaViT heads add no parameters, so this is the only "
               "count of the row at timm's head width (73.2M held at 32); the 0.65M gap is no layer's size"),
    # Table 5: large models
    TimmPreset("timm-vit-l", 5, "vit_large_patch16_224", _NONE,
               "(24, 16) 4096", "80.6", "94.4", "203.6", "200.0", 304_326_632, _VIT_L_COUNT),
    TimmPreset("timm-vit-l-reduced", 5, "vit_large_patch16_224",
               TimmChanges(depth=8, heads=30, mlp_ratio=2.0, head_dim=64),
               "(8, 30) 2048", "81.1", "95.1", "98.6", "115.2", 98_597_864),
    # timm has no DeiT-L: DeiT-B's model at ViT-L's width, depth and heads
    TimmPreset("timm-deit-l", 5, "deit_base_patch16_224", _DEIT_L,
               "(24, 16) 4096", "81.5", "95.3", "203.6", "200.0", 304_326_632, _VIT_L_COUNT),
    TimmPreset("timm-deit-l-reduced", 5, "deit_base_patch16_224",
               TimmChanges(depth=8, heads=30, mlp_ratio=2.0, embed_dim=1024, head_dim=64),
               "(8, 30) 2048", "81.8", "95.4", "98.6", "115.2", 98_597_864),
    TimmPreset("timm-xcit-l", 5, "xcit_large_24_p16_224", _NONE,
               "(24, 16) 3072", "82.1", "95.9", "189.1", "275.2", 189_096_136),
    # timm's head width (32): held at 48 the count is 118.0M
    TimmPreset("timm-xcit-l-reduced", 5, "xcit_large_24_p16_224", TimmChanges(depth=12, heads=24),
               "(12, 24) 3072", "82.4", "95.9", "103.8", "160.8", 103_792_744),
    TimmPreset("timm-volo-d4", 5, "volo_d4_224", _NONE,
               "([8, 8, 16, 4], [12, 16, 16, 16]) (1536, 3072, 3072, 3072)", "83.0", "96.1", "193.0", "294.4",
               192_961_520,
               _VOLO_RATIO_3.format(mlp="1152, 2304, 2304, 2304", base="volo_d4_224", ratio=4, count="230.7M")),
    TimmPreset("timm-volo-d4-reduced", 5, "volo_d4_224", TimmChanges(depth=(4, 4, 8, 2), heads=(24, 32, 32, 32)),
               "([4, 4, 8, 2], [24, 32, 32, 32]) (768, 1536, 1536, 1536)", "83.1", "96.2", "105.6", "188.8",
               105_556_976,
               _VOLO_RATIO_3.format(mlp="1152, 2304, 2304, 2304", base="volo_d4_224", ratio=2, count="85.5M")),
    TimmPreset("timm-davit-l", 5, "davit_large", _NONE,
               "([1, 1, 9, 1], [6, 12, 24, 48]) (768, 1536, 3072, 6144)", "83.6", "96.5", "196.8", "238.4",
               196_811_752),
    TimmPreset("timm-davit-l-reduced", 5, "davit_large", TimmChanges(depth=(1, 1, 5, 1), heads=(6, 12, 48, 48)),
               "([1, 1, 5, 1], [6, 12, 48, 48]) (768, 1536, 3072, 6144)", "83.6", "96.6", "140.0", "186.4",
               139_985_896),
)


def timm_preset(name: str) -> TimmPreset:
    """The preset called ``name``; refuses an unknown one with the closest names."""
    by_name = {p.name: p for p in PRESETS}
    if name not in by_name:
        close = difflib.get_close_matches(name, by_name, n=3, cutoff=0.5)
        hint = f" (closest: {', '.join(close)})" if close else ""
        raise HeadwiseError(f"unknown timm preset {name!r}{hint}")
    return by_name[name]


def _check_images(preset: TimmPreset, image_size: int, in_chans: int) -> None:
    """A preset is the paper's model for 224 px RGB images; refuse others (change the model instead)."""
    if (image_size, in_chans) != (224, 3):
        raise HeadwiseError(f"timm preset {preset.name!r} is for 224 px images of 3 channels, got {image_size} px "
                            f"of {in_chans}: build {preset.model!r} with its changes for other images")


def build_preset(name: str, *, num_classes: int = 1000, image_size: int = 224, in_chans: int = 3):
    """The model of preset ``name`` for ``num_classes`` classes (torch's default device)."""
    preset = timm_preset(name)
    _check_images(preset, image_size, in_chans)
    return build_timm_model(preset.model, preset.changes, num_classes=num_classes)


def preset_counts() -> list[dict[str, object]]:
    """Every preset with its table, construction, our count (counted now, on the meta device), the
    paper's, and the difference where there is one: the rows a listing prints."""
    return [dict(name=p.name, table=p.table, construction=p.construction(), ours=count_parameters(p.model, p.changes),
                 paper=p.paper_params, difference=p.difference) for p in PRESETS]


def markdown_counts() -> str:
    """:func:`preset_counts` as a markdown table (``python -m headwise.families.vision.timm_presets``)."""
    rows = ["| preset | table | construction | ours (M) | paper (M) | difference |", "|---|---|---|---|---|---|"]
    rows += [f"| {r['name']} | {r['table']} | `{r['construction']}` | {r['ours'] / 1e6:.3f} | {r['paper']} | "
             f"{r['difference'] or 'none'} |" for r in preset_counts()]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_counts())
