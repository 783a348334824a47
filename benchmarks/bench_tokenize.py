"""Tokenization throughput of the ``gpt-neo`` tokenizer on the shared TinyStories train sample.

    python3 benchmarks/bench_tokenize.py [--data DIR] [--repeats 5] [--out result.json]

The measurement is :mod:`headwise.families.lm.bench` (also the ``tokenize`` section of
``headwise bench``); this script only defaults the data folder to ``../shared/data`` beside this
checkout, whatever the current folder, when neither ``--data`` nor ``$HEADWISE_DATA`` is given.
"""

import sys
from pathlib import Path

from headwise.families.lm.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], default_data=Path(__file__).resolve().parents[2] / "shared" / "data"))
