"""The sizes of one benchmark run (:class:`BenchConfig`): every section's (the sections themselves
are :mod:`headwise.bench.sections`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BenchConfig:
    """Sizes of one benchmark run. :meth:`quick_config` is the ~1-2 minute smoke-sized variant."""

    d_model: int = 768
    n_layers: int = 4
    vocab_size: int = 50257
    seq_lens: tuple[int, ...] = (256, 512)
    tokens_per_step: int = 1024  # batch = tokens_per_step // seq_len
    rounds: int = 5
    warmup: int = 1
    schemes: tuple[str, ...] = ("constant", "ascending", "descending")
    totals: tuple[int, ...] = (45, 90, 180)
    bf16_totals: tuple[int, ...] = (45, 180)  # constant plans also timed under bf16 autocast (longest T)
    peak_n: int = 2048
    idle_wait: float = 30.0  # seconds to wait, before each round, for other jobs to go quiet
    threads: int | None = None  # torch.set_num_threads; None keeps torch's default (one per core)
    gen_new_tokens: int = 500
    gen_prompt_tokens: int = 16
    gen_rounds: int = 2
    tokenize_repeats: int = 3
    gpu_tokens_per_step: int = 16384
    gpu_rounds: int = 5
    gpu_warmup: int = 2
    gpu_peak_n: int = 8192
    # vision: a 32 px, patch 4 ViT (65 positions), d 192, 6 layers, MLP 768, 10 classes, at each
    # head count of vision_heads (tied head width: the same parameters); fp32 training steps of
    # vision_batch images; a short wait for quiet before each round keeps the section under ~90 s
    vision_image_size: int = 32
    vision_patch_size: int = 4
    vision_channels: int = 3
    vision_d_model: int = 192
    vision_layers: int = 6
    vision_heads: tuple[int, ...] = (3, 12)
    vision_mlp_hidden: int = 768
    vision_classes: int = 10
    vision_batch: int = 64
    vision_rounds: int = 5
    vision_warmup: int = 1
    vision_idle_wait: float = 5.0
    # nystrom: one attention layer (qkv projection, attention, output projection), d 64, 2 heads of
    # width 32, 64 landmarks, no conv, forward + backward on B x T random inputs, at each length;
    # a sample is as many passes as take ~nystrom_sample_s; ~30-60 s in all
    nystrom_seq_lens: tuple[int, ...] = (1024, 2048, 4096)
    nystrom_d_model: int = 64
    nystrom_heads: int = 2
    nystrom_landmarks: int = 64
    nystrom_pinv_iterations: int = 6
    nystrom_batch: int = 1
    nystrom_sample_s: float = 0.1
    nystrom_rounds: int = 11
    nystrom_warmup: int = 2
    nystrom_idle_wait: float = 1.0
    nystrom_softmax_target_from: int = 2048  # Nystrom must beat softmax attention from this length on
    # encoder: the crammed-bert preset (16 layers, d 768, gated MLP 3072, vocabulary 32,768), fp32
    # masked-LM steps of encoder_batch rows of 128 at 25% masking, at each uniform head count of
    # encoder_heads (the first is the preset's; HF's BertForMaskedLM is timed at each) and a linear
    # per-layer ramp per ratio of encoder_ramps (last / first layer) at the first count's budget
    encoder_preset: str = "crammed-bert"
    encoder_layers: int = 16
    encoder_d_model: int = 768
    encoder_mlp_hidden: int = 3072
    encoder_vocab_size: int = 32768
    encoder_seq_len: int = 128
    encoder_batch: int = 8
    encoder_mask_rate: float = 0.25
    encoder_heads: tuple[int, ...] = (12, 24)
    encoder_ramps: tuple[float, ...] = (4.0, 0.25)
    encoder_rounds: int = 5
    encoder_warmup: int = 1
    encoder_idle_wait: float = 5.0
    seed: int = 0
    quick: bool = False

    @classmethod
    def quick_config(cls) -> BenchConfig:
        """Vocabulary 8192, 512 tokens per step, three rounds, 100 generated tokens; an encoder of
        4 layers, d 256, vocabulary 8192 at 4 and 8 heads."""
        return cls(vocab_size=8192, tokens_per_step=512, rounds=3, gen_new_tokens=100, gen_rounds=1,
                   tokenize_repeats=1, vision_rounds=3, nystrom_rounds=3, nystrom_warmup=1,
                   nystrom_sample_s=0.03, gpu_rounds=3, gpu_warmup=1, idle_wait=5.0, encoder_layers=4,
                   encoder_d_model=256, encoder_mlp_hidden=1024, encoder_vocab_size=8192, encoder_heads=(4, 8),
                   encoder_rounds=3, quick=True)

    def batch(self, seq_len: int, tokens_per_step: int | None = None) -> int:
        """Sequences per step at ``seq_len`` (at least one)."""
        return max(1, (tokens_per_step or self.tokens_per_step) // seq_len)
