"""Text data for language modelling: sources, tokenizers, token caches and packed batches.

    cache = prepare(DataConfig(source="tinystories-train-sample.txt", tokenizer="bpe:4096"))
    stream = PackedStream(cache.tokens("train"), block_size=256, micro_batch=8, seed=0)
"""

from headwise.data.batch import Batch, BatchStream
from headwise.data.cache import (
    CacheInvalid,
    TokenCache,
    default_cache_dir,
    list_caches,
    prepare,
    token_dtype,
)
from headwise.data.packing import PackedStream, gather_blocks, num_blocks
from headwise.data.plan import DataConfig, DataPlan, plan_data
from headwise.data.sources import Source, open_source
from headwise.data.tokenizer import (
    BPETokenizer,
    GPTNeoTokenizer,
    Tokenizer,
    gpt_neo_files,
    gpt_neo_tokenizer,
    parse_tokenizer_spec,
)

__all__ = [
    "BPETokenizer",
    "Batch",
    "BatchStream",
    "CacheInvalid",
    "DataConfig",
    "DataPlan",
    "GPTNeoTokenizer",
    "PackedStream",
    "Source",
    "TokenCache",
    "Tokenizer",
    "default_cache_dir",
    "gather_blocks",
    "gpt_neo_files",
    "gpt_neo_tokenizer",
    "list_caches",
    "num_blocks",
    "open_source",
    "parse_tokenizer_spec",
    "plan_data",
    "prepare",
    "token_dtype",
]
