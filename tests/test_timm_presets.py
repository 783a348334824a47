"""The 22 presets of Leaner Transformers' Tables 4-5 as data, without torch or timm: names, tables,
the paper's columns as printed, lookup and the images a preset refuses (the counts are
tests/test_timm_models.py's)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from headwise.errors import HeadwiseError
from headwise.families.vision.timm_presets import PRESETS, build_preset, timm_preset

TABLE_4 = ("vit-b", "deit-b", "xcit-m", "tnt-b", "volo-d3", "davit-b")
TABLE_5 = ("vit-l", "deit-l", "xcit-l", "volo-d4", "davit-l")


def test_every_configuration_of_tables_4_and_5_is_a_preset_original_and_reduced():
    expected = [(f"timm-{m}{kind}", table) for table, models in ((4, TABLE_4), (5, TABLE_5))
                for m in models for kind in ("", "-reduced")]
    assert [(p.name, p.table) for p in PRESETS] == expected


@pytest.mark.parametrize("model", TABLE_4 + TABLE_5)
def test_each_reduced_model_has_fewer_parameters_and_the_same_timm_model(model):
    original, reduced = timm_preset(f"timm-{model}"), timm_preset(f"timm-{model}-reduced")
    assert reduced.model == original.model
    assert reduced.params < original.params
    assert float(reduced.paper_params) < float(original.paper_params)


# rows hand-copied from Tables 4 and 5: (Depth, Heads) MLP dim., Top-1, Top-5, Params (M), Memory (GB)
PRINTED = {
    "timm-vit-b": ("(12, 12) 3072", "80.1", "94.2", "86.6", "178.4"),
    "timm-deit-b-reduced": ("(7, 16) 1536", "80.8", "95.3", "40.1", "101.6"),
    "timm-xcit-m-reduced": ("(12, 16) 2048", "81.7", "95.6", "59.0", "196"),
    "timm-volo-d3": ("([8, 8, 16, 4], [8, 16, 16, 16]) (1024, 2048, 2048, 2048)", "82.6", "95.6", "86", "209.2"),
    "timm-vit-l": ("(24, 16) 4096", "80.6", "94.4", "203.6", "200.0"),
    "timm-davit-l-reduced": ("([1, 1, 5, 1], [6, 12, 48, 48]) (768, 1536, 3072, 6144)", "83.6", "96.6", "140.0",
                             "186.4"),
}


@pytest.mark.parametrize("name", PRINTED)
def test_a_presets_paper_columns_are_its_row_as_printed(name):
    p = timm_preset(name)
    assert (p.row, p.paper_top1, p.paper_top5, p.paper_params, p.paper_memory_gb) == PRINTED[name]


@pytest.mark.parametrize("model", TABLE_4 + TABLE_5)
def test_each_reduced_model_trains_in_less_memory_at_no_lower_top1_in_the_paper(model):
    original, reduced = timm_preset(f"timm-{model}"), timm_preset(f"timm-{model}-reduced")
    assert float(reduced.paper_memory_gb) < float(original.paper_memory_gb)
    assert float(reduced.paper_top1) >= float(original.paper_top1)
    assert float(reduced.paper_top5) >= float(original.paper_top5)
    assert 70 < float(reduced.paper_top1) < float(reduced.paper_top5) < 100


def test_a_construction_reads_as_the_timm_model_and_its_changes():
    assert timm_preset("timm-vit-b-reduced").construction() == \
        "vit_base_patch16_224 depth=7 heads=16 mlp_ratio=2.0 head_dim=64"
    assert timm_preset("timm-davit-l-reduced").construction() == "davit_large depth=1,1,5,1 heads=6,12,48,48"
    assert timm_preset("timm-xcit-l").construction() == "xcit_large_24_p16_224"


def test_an_unknown_preset_is_refused_with_the_closest_names():
    with pytest.raises(HeadwiseError, match=r"unknown timm preset 'timm-vit-b-reduce' \(closest: timm-vit-b-reduced"):
        timm_preset("timm-vit-b-reduce")


@pytest.mark.parametrize("size, chans", [(32, 3), (224, 1)])
def test_a_preset_refuses_images_other_than_the_papers(size, chans):
    with pytest.raises(HeadwiseError, match="is for 224 px images of 3 channels"):
        build_preset("timm-deit-b", image_size=size, in_chans=chans)


def test_the_presets_load_neither_torch_nor_timm():
    code = ("import sys, headwise.families.vision.timm_presets; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'timm', 'torchvision')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
