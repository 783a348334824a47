"""Print what corenet's own code makes of OpenELM's layer-wise scaling, for the test data of
tests/test_openelm_parity.py: ``python tests/record_corenet.py CORENET`` (a git checkout of
apple/corenet). corenet's ``GPTConfig`` (with ``compute_heads``) and its ``make_divisible`` are
lifted out of its sources with ``ast`` and run as they are, with numpy: no other corenet module
(nor torch) is imported, and nothing of corenet is copied here.

It prints ``CORENET_ROUNDING``: for depths 2 to 40 and OpenELM's two multiplier ranges, each
layer whose multiplier corenet rounds otherwise than Python's ``round`` of the same ``linspace``
value; and ``CORENET_HEADS``: the query heads at width 112, 8-wide heads in groups of 2, of the
depths and query multipliers (its keys) where that rounding changes a layer's heads.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import typing
from dataclasses import dataclass
from numbers import Number

import numpy as np


def corenet(checkout: str) -> dict[str, typing.Any]:
    """corenet's ``GPTConfig``, ``compute_heads`` and ``make_divisible``, run from its sources."""
    namespace = dict(np=np, Number=Number, dataclass=dataclass, Union=typing.Union, List=typing.List,
                     Optional=typing.Optional)
    for path, names in (("corenet/utils/math_utils.py", {"make_divisible"}),
                        ("corenet/modeling/models/language_modeling/general_gpt.py", {"compute_heads", "GPTConfig"})):
        source = subprocess.run(["git", "-C", checkout, "show", f"HEAD:{path}"], check=True, capture_output=True,
                                text=True).stdout
        wanted = [node for node in ast.parse(source).body if getattr(node, "name", None) in names]
        exec(compile(ast.Module(wanted, type_ignores=[]), path, "exec"), namespace)
    return namespace


def main(checkout: str) -> None:
    config = corenet(checkout)["GPTConfig"]
    rounding = {}
    for pair in ((0.5, 1.0), (0.5, 4.0)):
        for n in range(2, 41):
            theirs = config(num_transformer_layers=n, ffn_multipliers=pair).ffn_multipliers
            python = [round(float(v), 2) for v in np.linspace(*pair, num=n, dtype=float)]
            differ = {i: float(m) for i, (m, p) in enumerate(zip(theirs, python)) if float(m) != p}
            if differ:
                rounding[(pair, n)] = differ
    heads = {(n, pair): tuple(config(num_transformer_layers=n, model_dim=112, head_dim=8, num_gqa_groups=2,
                                     qkv_multipliers=pair).num_query_heads)
             for n, pair in ((21, (0.5, 1.0)), (3, (0.85, 1.0)), (5, (0.3, 1.0)))}
    print(f"CORENET_ROUNDING = {rounding}\nCORENET_HEADS = {heads}")


if __name__ == "__main__":
    main(sys.argv[1])
