"""benchmarks/compare_bench.py: the ratios it prints, on hand-made results."""

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "compare_bench", Path(__file__).resolve().parents[1] / "benchmarks" / "compare_bench.py")
compare_bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_bench)


def _result(tokens: list[float], decode: float) -> dict:
    return {"machine": {}, "training": [{"cases": {"a": {"tokens_per_s": tokens, "basis": "x"}}}],
            "decode": {"tokens_per_s_median": decode}, "gpu": {"tokens_per_s_median": 1.0}}


def test_ratio_is_the_mean_after_over_the_mean_before_of_each_case_median():
    before = [_result([1.0, 2.0, 3.0], 10.0), _result([4.0, 4.0, 4.0], 30.0)]  # medians 2 and 4: mean 3
    after = [_result([6.0, 6.0, 9.0], 20.0), _result([1.0, 3.0, 5.0], 20.0)]   # medians 6 and 3: mean 4.5
    out = compare_bench.ratios(before, after)
    assert out == {"decode": [20.0 / 20.0], "training": [4.5 / 3.0]}  # the gpu section is not compared
