"""The checks the decoder parity tests (Llama/Qwen3, Laguna) share: a headwise model against a
``transformers`` model holding the same weights."""

from __future__ import annotations

import torch

from headwise.params import count_params
from headwise.train.generate import generate


def perturbed(model: torch.nn.Module, seed: int) -> None:
    """Move every parameter (the norms' ones too, so a comparison cannot pass on ones and zeros);
    the large scale spreads the logits, so greedy tokens are decided well above float noise."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))


def assert_logits_match(name: str, ours: torch.nn.Module, theirs: torch.nn.Module, vocab: int) -> None:
    """Logits within 1e-5 on random ids, and the same exact parameter count on both sides."""
    x = torch.randint(0, vocab, (3, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        diff = (ours(x) - theirs(x).logits).abs().max().item()
    print(f"{name}: max |logits diff| {diff:.3g}")
    assert diff < 1e-5
    assert count_params(ours.spec) == ours.num_params() == sum(p.numel() for p in theirs.parameters())


def assert_same_greedy_tokens(ours: torch.nn.Module, theirs: torch.nn.Module) -> None:
    """headwise's greedy tokens, with and without its KV cache, equal ``theirs.generate``'s."""
    theirs.generation_config.eos_token_id = None  # greedy to the end, never stopped early
    theirs.generation_config.pad_token_id = 0
    distinct = []
    for prompt in ([5, 17, 42, 8, 3], [1, 2, 3]):
        with torch.no_grad():
            expected = theirs.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False,
                                       use_cache=True)[0, len(prompt):].tolist()
        cached = generate(ours, prompt, 30, temperature=0)
        uncached = generate(ours, prompt, 30, temperature=0, use_cache=False)
        assert cached == uncached == expected, prompt
        distinct.append(len(set(expected)))
    assert max(distinct) > 3  # not only a degenerate repetition (a random model falls into some)
