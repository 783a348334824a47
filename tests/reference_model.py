"""A reference token model written from the definitions, nanoGPT-sized: plain matmuls and softmax
(no SDPA, no headwise model code) over a headwise ``Transformer``'s state dict and its spec. Pre-norm
blocks (LayerNorm or RMSNorm), learned or rotary positions, grouped KV heads, q/k RMSNorms, local
windows, output gates, a padding mask. ``tests/test_reference_model.py`` uses it as an oracle."""

import math

import torch
import torch.nn.functional as F

ACTIVATIONS = {"gelu_new": lambda x: F.gelu(x, approximate="tanh"), "gelu": F.gelu, "relu": F.relu}


def rms_norm(x, weight, eps):
    return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def norm(x, sd, name, spec):
    """The block norm ``name``: LayerNorm ``weight * (x - mean) / std + bias``, or RMSNorm ``weight * x / rms``."""
    if spec.norm == "rmsnorm_pre":
        return rms_norm(x, sd[f"{name}.weight"], spec.layer_norm_eps)
    return rms_norm(x - x.mean(-1, keepdim=True), sd[f"{name}.weight"], spec.layer_norm_eps) + sd[f"{name}.bias"]


def linear(x, sd, name):
    bias = sd.get(f"{name}.bias")
    return x @ sd[f"{name}.weight"].T + (0 if bias is None else bias)


def rotate(x, dim, theta):
    """x [B, H, T, D] with channel pair (i, i + dim/2), i < dim/2, of position t turned by the angle
    t * theta^(-2i / dim); channels from dim on pass unchanged."""
    t = torch.arange(x.shape[2], dtype=x.dtype)[:, None]
    angle = t * theta ** (-torch.arange(0, dim, 2, dtype=x.dtype) / dim)  # [T, dim / 2]
    a, b, rest = x[..., : dim // 2], x[..., dim // 2 : dim], x[..., dim:]
    return torch.cat([a * angle.cos() - b * angle.sin(), b * angle.cos() + a * angle.sin(), rest], dim=-1)


def attention(x, sd, p, shape, spec, key_mask):
    """One layer's attention output [B, T, d] for its normed input x [B, T, d]."""
    b, t, _ = x.shape
    h, kv, d = shape.heads, shape.kv_heads or shape.heads, shape.head_dim
    q, k, v = linear(x, sd, f"{p}.qkv").split([h * d, kv * d, kv * d], dim=-1)
    q, k, v = (y.view(b, t, -1, d).transpose(1, 2) for y in (q, k, v))  # [B, heads, T, d]
    if spec.qk_norm:
        q, k = (rms_norm(y, sd[f"{p}.{n}.weight"], spec.layer_norm_eps) for y, n in ((q, "q_norm"), (k, "k_norm")))
    if spec.positions == "rope":
        dim = int(d * spec.partial_rotary_factor)
        q, k = rotate(q, dim, spec.rope_theta), rotate(k, dim, spec.rope_theta)
    k, v = k.repeat_interleave(h // kv, dim=1), v.repeat_interleave(h // kv, dim=1)  # query head i reads KV head i // (h / kv)
    scores = q @ k.transpose(-1, -2) / (math.sqrt(d) if spec.score_scale == "inv_sqrt" else 1)
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    allowed = (j <= i) if spec.causal else torch.ones(t, t, dtype=torch.bool)
    if shape.attention == "local":
        allowed = allowed & (j > i - spec.window)
    if key_mask is not None:
        allowed = allowed & key_mask[:, None, None, :]
    y = scores.masked_fill(~allowed, -math.inf).softmax(-1) @ v  # [B, heads, T, d]
    if spec.output_gate:
        gate = F.softplus(linear(x, sd, f"{p}.gate"))  # [B, T, heads] or [B, T, heads * d]
        y = y * (gate.transpose(1, 2)[..., None] if spec.output_gate == "softplus_head"
                 else gate.view(b, t, h, d).transpose(1, 2))
    return linear(y.transpose(1, 2).reshape(b, t, h * d), sd, f"{p}.out")


def mlp(x, sd, p, spec):
    x = linear(x, sd, f"{p}.fc")
    if spec.activation == "swiglu":
        value, gate = x.chunk(2, dim=-1)
        return linear(F.silu(gate) * value, sd, f"{p}.proj")
    return linear(ACTIVATIONS[spec.activation](x), sd, f"{p}.proj")


def logits(spec, sd, ids):
    """Next-token (or masked-token) logits [B, T, vocab] of token ids [B, T]."""
    sd = {name: w.double() for name, w in sd.items()}
    x = sd["tok_emb.weight"][ids]
    if spec.positions == "learned":
        x = x + sd["pos_emb.weight"][: ids.shape[1]]
    key_mask = None if spec.pad_id is None else ids != spec.pad_id
    for i, shape in enumerate(spec.layers()):
        p = f"blocks.{i}"
        x = x + attention(norm(x, sd, f"{p}.norm1", spec), sd, f"{p}.attn", shape, spec, key_mask)
        x = x + mlp(norm(x, sd, f"{p}.norm2", spec), sd, f"{p}.mlp", spec)
    return norm(x, sd, "norm_f", spec) @ sd["lm_head.weight"].T
