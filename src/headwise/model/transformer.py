"""The transformer: every layer with its own head count and head width.

One file, nanoGPT style: attention, MLP, block, and the Transformer that runs front end -> blocks
-> final norm -> output head. With a uniform spec and GPT-Neo's options it is exactly Hugging
Face's ``GPTNeoForCausalLM`` (see :mod:`headwise.hf.gpt_neo`); with Llama's (RMSNorm, SwiGLU,
RoPE, grouped key/value heads, q/k norms) ``LlamaForCausalLM`` or ``Qwen3ForCausalLM``
(:mod:`headwise.hf.llama`), and with per-layer query heads and a softplus output gate
``LagunaForCausalLM`` (:mod:`headwise.hf.laguna`). The front end and the head come from the
spec through the registries of :mod:`headwise.model.inputs` and :mod:`headwise.model.outputs`, each
layer's attention kind through :data:`headwise.model.attention.ATTENTION_KINDS`; how attention runs
fast on the CPU is :mod:`headwise.model.kernels`' business.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from headwise.model.attention import ATTENTION_KINDS
from headwise.model.cache import KVCache, LayerCache
from headwise.model.features import ACTIVATIONS, EMBEDDING_NORMS, NORMS, OUTPUT_GATES, POSITIONS, QK_NORMS
from headwise.model.inputs import FRONT_ENDS
from headwise.model.outputs import OUTPUT_HEADS
from headwise.spec import LayerShape, ModelSpec


class Attention(nn.Module):
    """All heads of a layer in one fused projection ``qkv`` (q of every query head, then k and v
    of every key/value head), split into q [B, heads, T, head_dim] and k, v [B, kv_heads, T,
    head_dim], each head's q and k normed (``qk_norm``) and rotated (``positions = "rope"``), then
    attending as the layer's kind does (:mod:`headwise.model.attention`: softmax attention in one
    SDPA call, a local window, the Nyström approximation, ...), gated (``output_gate``), and one
    output projection. So every kind gets grouped-query attention, q/k norms and RoPE, and a KV
    cache stores the KV heads alone."""

    def __init__(self, spec: ModelSpec, shape: LayerShape) -> None:
        super().__init__()
        self.heads, self.head_dim, self.width = shape.heads, shape.head_dim, shape.width
        self.kv_heads = shape.kv_heads or shape.heads
        kv_width = self.kv_heads * self.head_dim
        self.qkv = nn.Linear(spec.d_model, self.width + 2 * kv_width, bias=spec.qkv_bias)
        self.out = nn.Linear(self.width, spec.d_model, bias=spec.out_bias)
        self.causal = spec.causal
        self.scale = 1.0 if spec.score_scale == "none" else self.head_dim**-0.5
        self.dropout = spec.dropout
        self.kind = ATTENTION_KINDS[shape.attention]
        # Qwen3's q/k norms: one over head_dim for all of the layer's query heads, one for its key heads
        qk_norm = QK_NORMS.get(spec.qk_norm)
        self.q_norm = qk_norm.build(spec, self.head_dim) if qk_norm is not None else None
        self.k_norm = qk_norm.build(spec, self.head_dim) if qk_norm is not None else None
        self.rotary = POSITIONS[spec.positions].rotary(spec, shape)
        #: whether the layer's output at a position is the same for any order of the others (a
        #: bidirectional layer of a reorderable kind: see :func:`selected_first`); rotary
        #: positions make attention depend on where the keys are, so a RoPE layer never is
        self.reorderable = not self.causal and self.kind.reorderable and self.rotary is None
        # the kind's settings and modules, built after the projections (the order the weights
        # are drawn in, which a seed reproduces)
        self.kind.build(self, spec, shape)
        # the output gate (Laguna's g_proj): its projection of the layer's input, last (a config.json
        # written before output gates has no such field: no gate)
        self.output_gate = OUTPUT_GATES.get(getattr(spec, "output_gate", None))
        if self.output_gate is not None:
            self.gate = nn.Linear(spec.d_model, self.output_gate.width(self.heads, self.head_dim), bias=False)

    def forward(self, x: Tensor, cache: LayerCache | None = None, queries: int | None = None,
                key_mask: Tensor | None = None) -> Tensor:
        """The layer's output for ``x`` [B, T, d]; ``queries``: for the first this many positions
        only; ``key_mask`` [B, T]: False at padding, which no position attends to."""
        q, k, v = self.split_heads(self.qkv(x), cache.length if cache is not None else 0)
        y = self.kind.forward(self, q, k, v, cache, queries, key_mask)
        if self.output_gate is not None:
            # the gate of each position the outputs are for (the first `queries` ones, or all)
            y = self.output_gate.apply(self.gate(x[:, :y.shape[2]]), y.transpose(1, 2)).transpose(1, 2)
        # SDPA's output is laid out [B, T, heads, head_dim] in memory: unless the kernel padded the
        # heads, this reshape copies nothing
        return self.out(y.transpose(1, 2).reshape(x.shape[0], y.shape[2], self.width))

    def split_heads(self, projected: Tensor, past: int) -> tuple[Tensor, Tensor, Tensor]:
        """q [B, heads, T, head_dim] and k, v [B, kv_heads, T, head_dim] of the projection
        ``projected`` [B, T, ...] at positions ``past ..``, q and k normed and rotated as the
        layer's options say (views of the projection where nothing changes them, in SDPA's layout:
        [B, T, heads, head_dim] in memory)."""
        b, t, _ = projected.shape
        kv_width = self.kv_heads * self.head_dim
        # one split (not three slices): its backward writes the three gradients side by side at once
        q, k, v = projected.split((self.width, kv_width, kv_width), dim=-1)
        q = q.view(b, t, self.heads, self.head_dim)
        k = k.view(b, t, self.kv_heads, self.head_dim)
        v = v.view(b, t, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            # under autocast q and k come in bf16 while the norms' weights stay float32: normalise in
            # the weights' dtype (torch's fused RMSNorm takes one dtype; mixed, it warns and falls
            # back to the composite) and hand the result on in q's dtype
            q = self.q_norm(q.to(self.q_norm.weight.dtype)).to(q.dtype)
            k = self.k_norm(k.to(self.k_norm.weight.dtype)).to(k.dtype)
        if self.rotary is not None:
            q, k = self.rotary(q, k, past)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def selected_first(x: Tensor, key_mask: Tensor | None, select: Tensor) -> tuple[Tensor, Tensor | None, int, Tensor]:
    """Each row of ``x`` [B, T, d] (and of ``key_mask``) reordered so that the positions where
    ``select`` [B, T] is True come first, in their order; the number q of leading positions that
    holds every row's selected ones; and which of those are selected, [B, q].

    A bidirectional softmax layer is indifferent to the order of its positions (they are in the
    embeddings already), so the last block then computes its queries, MLP and final norm at the q
    leading positions alone: a masked LM's last block at about a quarter of the work, the same
    states at the masked positions."""
    counts = select.sum(1)
    order = torch.argsort((~select).to(torch.uint8), dim=1, stable=True)
    x = x.gather(1, order[..., None].expand_as(x))
    key_mask = None if key_mask is None else key_mask.gather(1, order)
    q = int(counts.max())
    return x, key_mask, q, torch.arange(q, device=x.device) < counts[:, None]


class MLP(nn.Module):
    """Two linear maps d_model -> mlp_hidden -> d_model with the spec's activation between; a
    gated activation (:class:`~headwise.model.features.Activation`) halves the width the second reads."""

    def __init__(self, spec: ModelSpec, shape: LayerShape) -> None:
        super().__init__()
        self.act = ACTIVATIONS[spec.activation]
        inner = shape.mlp_hidden // 2 if self.act.gated else shape.mlp_hidden
        self.fc = nn.Linear(spec.d_model, shape.mlp_hidden, bias=spec.mlp_bias)
        self.proj = nn.Linear(inner, spec.d_model, bias=spec.mlp_bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.act(self.fc(x)))


def drop_path_rates(spec: ModelSpec) -> list[float]:
    """Each block's drop-path rate: rising linearly from 0 at the first block to ``spec.drop_path``
    at the last (timm's VisionTransformer: ``torch.linspace(0, drop_path_rate, depth)``, so one
    block alone gets 0)."""
    rate, n = spec.drop_path or 0.0, spec.n_layers
    return [rate * i / (n - 1) if n > 1 else 0.0 for i in range(n)]


class DropPath(nn.Module):
    """Stochastic depth on a residual branch: in training, each sample's branch output is zeroed
    with probability ``p`` and the kept ones are scaled by 1 / (1 - p) (timm's ``DropPath``); in
    evaluation, or with ``p = 0``, the identity. Masks come from torch's global generator, as
    dropout's do."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask.div_(keep)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Block(nn.Module):
    """Attention and MLP with residuals; pre-norm (GPT-Neo) or post-norm (Amsel et al.). With a
    ``drop_path`` rate, each residual branch is dropped per sample on its own (:class:`DropPath`)."""

    def __init__(self, spec: ModelSpec, shape: LayerShape, drop_path: float = 0.0) -> None:
        super().__init__()
        norm = NORMS[spec.norm]
        self.pre_norm = norm.pre
        self.norm1 = norm.build(spec, spec.d_model)
        self.attn = Attention(spec, shape)
        self.norm2 = norm.build(spec, spec.d_model)
        self.mlp = MLP(spec, shape)
        self.drop = nn.Dropout(spec.dropout)
        self.drop_path = DropPath(drop_path)

    def forward(self, x: Tensor, cache: LayerCache | None = None, queries: int | None = None,
                key_mask: Tensor | None = None) -> Tensor:
        """The block's output for ``x`` [B, T, d]; ``queries``: for the first this many positions
        only (their attention still reads every position); ``key_mask``: see :class:`Attention`."""
        kept = x if queries is None else x[:, :queries]
        branch = self.drop_path
        if self.pre_norm:
            x = kept + branch(self.drop(self.attn(self.norm1(x), cache, queries, key_mask)))
            return x + branch(self.drop(self.mlp(self.norm2(x))))
        x = self.norm1(kept + branch(self.drop(self.attn(x, cache, queries, key_mask))))
        return self.norm2(x + branch(self.drop(self.mlp(x))))


class Transformer(nn.Module):
    """Front end -> (embedding norm) -> blocks -> final norm -> output head. By default a decoder
    LM (token ids -> logits); with ``inputs = "vectors"`` a vector encoder; with ``inputs =
    "images"`` a ViT (images -> class logits); with ``outputs = "mlm"`` a masked-LM encoder."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.front_end, self.output_head = FRONT_ENDS[spec.inputs], OUTPUT_HEADS[spec.output_head]
        # The front end's and the head's modules sit on the model itself (tok_emb, pos_emb, lm_head)
        for name, module in self.front_end.build(spec).items():
            setattr(self, name, module)
        # BERT's LayerNorm of the summed embeddings (``embedding_norm``); no parameters without it
        emb_norm = EMBEDDING_NORMS.get(spec.embedding_norm)
        self.emb_norm = emb_norm.build(spec, spec.d_model) if emb_norm is not None else nn.Identity()
        self.drop = nn.Dropout(spec.dropout)
        rates = drop_path_rates(spec)
        self.blocks = nn.ModuleList(Block(spec, shape, rate) for shape, rate in zip(spec.layers(), rates))
        # Pre-norm models end with a final norm (LayerNorm, RMSNorm); post-norm blocks already end normalised.
        norm = NORMS[spec.norm]
        self.norm_f = norm.build(spec, spec.d_model) if norm.pre else nn.Identity()
        for name, module in self.output_head.build(spec, self).items():
            setattr(self, name, module)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        # GPT-Neo's initialisation (and ViT's, but for truncation): N(0, std) weights, zero
        # biases, LayerNorm (1, 0).
        if isinstance(module, (nn.Linear, nn.Embedding, nn.Conv2d)):
            nn.init.normal_(module.weight, mean=0.0, std=self.spec.init_std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
            emb = getattr(self, "tok_emb", None)
            if emb is not None and emb.padding_idx is not None and module.weight is emb.weight:
                # An encoder's [PAD] row starts at zero (cramming's init), also after a tied
                # decoder's turn draws the matrix again; the draws are unchanged, so every other
                # weight is what it was without the row.
                with torch.no_grad():
                    module.weight[emb.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.RMSNorm):
            nn.init.ones_(module.weight)

    def forward(self, inputs: Tensor, cache: KVCache | None = None, pad_vocab: bool = False,
                select: Tensor | None = None) -> Tensor:
        """The output head's result for ``inputs``: logits [B, T, vocab] for token ids [B, T];
        vectors [B, N, d] for vectors [B, N, d]; class logits [B, classes] for images [B, C, H, W].

        ``pad_vocab=True`` (what training uses) returns logits [B, T, V_pad] whose columns past
        the vocabulary are -inf, computed faster (see :data:`~headwise.model.kernels.VOCAB_PAD`):
        softmax, cross-entropy and argmax over them equal those over the vocabulary. It does
        nothing without a vocabulary. A sequence longer than ``max_seq_len`` (with the cached
        positions) raises :class:`~headwise.model.inputs.SequenceTooLong`.

        ``select`` [B, T] bool (a vocabulary head only): decode only the positions where it is
        True, returning logits [N, vocab] for those N positions in row-major order: the final
        hidden states are gathered there before the head, so a masked LM's training decodes its
        masked positions alone (:func:`~headwise.model.loss.masked_lm_loss`).
        """
        if select is None:
            x, key_mask = self.features(inputs, cache)
            return self.output_head.forward(self, x, pad_vocab, key_mask)
        if not self.output_head.vocabulary:
            raise ValueError(f"select= picks positions to decode; outputs = {self.spec.output_head!r} decodes none")
        x, _ = self.features(inputs, cache, select)
        return self.output_head.forward(self, x, pad_vocab)

    def features(self, inputs: Tensor, cache: KVCache | None = None,
                 select: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """The final hidden states [B, T, d] (after the final norm; in training, only the leading
        positions the head reads) that :meth:`forward` hands to the output head, and the front
        end's key mask (see :meth:`~headwise.model.inputs.FrontEnd.key_mask`). With ``select``
        [B, T] bool: the states of the selected positions alone, [N, d] in row-major order (and
        no key mask), the last softmax block computing only those (see :func:`selected_first`)."""
        past = cache.length if cache is not None else 0
        x = self.drop(self.emb_norm(self.front_end.forward(self, inputs, past)))
        key_mask = self.front_end.key_mask(self, inputs)
        # A head that reads only the first positions (a ViT's class token) needs the last block's
        # queries, MLP and the final norm there alone: the same output for up to a 1 / n_layers
        # share less work. Only in training: evaluation and analysis look at every position.
        keep = self.output_head.positions_read(self.spec) if self.training and cache is None else None
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            if i == last and select is not None and cache is None and block.attn.reorderable:
                x, key_mask, keep, select = selected_first(x, key_mask, select)
            x = block(x, cache.layers[i] if cache is not None else None, keep if i == last else None, key_mask)
        if cache is not None:
            cache.length += x.shape[1]
        if select is not None:
            return self.norm_f(x[select]), None
        return self.norm_f(x), key_mask

    def new_cache(self) -> KVCache:
        """An empty key/value cache for incremental decoding with this model."""
        return KVCache(len(self.blocks))

    def num_params(self) -> int:
        """Trainable parameters, tied weights counted once."""
        return sum(p.numel() for p in self.parameters())
