"""Numerics check to run after any speed change to ``headwise.model``.

    python3 benchmarks/check_parity.py [--seq-len 512] [--new-tokens 300]

1. The blog's model (d 768, 4 layers G,L,G,L, window 256, vocab 50257) at 4 x 12, 4 x 48 and 4 x 96
   heads (96 heads of width 8 take the zero-padded attention path):
   logits against ``transformers``' GPTNeoForCausalLM with the same weights (``headwise.hf.gpt_neo.GPT_NEO.to_hf``),
   on a sequence longer than the window, and the gradients of the loss w.r.t. the shared weights.
2. KV-cache decoding (prompt, then one token at a time, past the local window) against the full
   forward, for a constant and a per-layer plan (96,48,24,12 heads).

Prints the largest differences and exits 1 if any exceeds its tolerance (1e-5 for logits vs HF;
1e-5 relative to the largest logit for cached vs full decoding).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from headwise.errors import OneLineParser, guarded
from headwise.hf.gpt_neo import GPT_NEO
from headwise.model import Transformer
from headwise.presets import spec_from_preset

LOGIT_TOL = 1e-5
GRAD_TOL = 1e-5


def _perturb(model: torch.nn.Module, seed: int) -> None:
    # Non-trivial biases and norms, so that a dropped term cannot hide behind zeros and ones.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))


def check_hf(heads: int, seq_len: int) -> list[tuple[str, float, float]]:
    """(what, max abs difference, tolerance) of logits and weight gradients vs GPT-Neo."""
    torch.manual_seed(0)
    ours = Transformer(spec_from_preset("blog-gpt-neo", heads=[heads] * 4))
    _perturb(ours, 1)
    theirs = GPT_NEO.to_hf(ours)
    theirs.config._attn_implementation = "eager"
    x = torch.randint(0, 50257, (1, seq_len + 1))
    a = ours(x[:, :-1])
    b = theirs(x[:, :-1], use_cache=False).logits
    rows = [(f"4x{heads} logits vs HF (T={seq_len})", (a - b).abs().max().item(), LOGIT_TOL)]
    for logits in (a, b):
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)).backward()
    pairs = [("blocks.1.attn.out.weight", "transformer.h.1.attn.attention.out_proj.weight"),
             ("blocks.3.mlp.fc.weight", "transformer.h.3.mlp.c_fc.weight"),
             ("tok_emb.weight", "transformer.wte.weight")]
    ours_p, theirs_p = dict(ours.named_parameters()), dict(theirs.named_parameters())
    for mine, hf in pairs:
        diff = (ours_p[mine].grad - theirs_p[hf].grad).abs().max().item()
        rows.append((f"4x{heads} grad {mine} vs HF", diff, GRAD_TOL))
    q_grad = ours_p["blocks.0.attn.qkv.weight"].grad[:768]
    rows.append((f"4x{heads} grad q-projection (layer 0) vs HF",
                 (q_grad - theirs_p["transformer.h.0.attn.attention.q_proj.weight"].grad).abs().max().item(), GRAD_TOL))
    return rows


@torch.no_grad()
def check_cache(heads: list[int], prompt: int, new_tokens: int) -> tuple[str, float, float]:
    """Largest difference between cached decoding and the full forward over the same tokens."""
    torch.manual_seed(0)
    model = Transformer(spec_from_preset("blog-gpt-neo", heads=heads, vocab_size=1000)).eval()
    _perturb(model, 2)
    x = torch.randint(0, 1000, (2, prompt + new_tokens))
    full = model(x)
    cache = model.new_cache()
    steps = [model(x[:, :prompt], cache)] + [model(x[:, i:i + 1], cache) for i in range(prompt, x.shape[1])]
    diff = (torch.cat(steps, dim=1) - full).abs().max().item()
    # Both sides are float32 sums in different orders: allow 1e-5 relative to the logits' scale.
    scale = max(1.0, full.abs().max().item())
    return (f"KV cache vs full forward, heads {heads}, {prompt}+{new_tokens} tokens (max |logit| {scale:.1f})",
            diff, LOGIT_TOL * scale)


@guarded("check_parity")
def main(argv: list[str] | None = None) -> int:
    """Run the checks; exit status 1 when one fails."""
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=300)
    args = parser.parse_args(argv)
    rows = check_hf(12, args.seq_len) + check_hf(48, args.seq_len) + check_hf(96, args.seq_len)
    rows.append(check_cache([12] * 4, 20, args.new_tokens))
    rows.append(check_cache([96, 48, 24, 12], 20, args.new_tokens))
    failed = 0
    for what, diff, tol in rows:
        ok = diff <= tol
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {diff:.2e} (tol {tol:.0e})  {what}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
