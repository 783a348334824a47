"""``ModelSpec``: the full description of a transformer whose layers may differ in heads and head width.

A spec is data, checked without the model code: what it knows of a front end or an output head
is that part's declaration (:mod:`headwise.parts`), so importing this module and checking a spec of
built-in parts load no torch and no family. Per-layer fields accept one value for every layer or a
list with one value per layer; :meth:`ModelSpec.layer` resolves them for one layer. Validation
names the layer, the value and what would be valid.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Annotated, Any, Literal, Sequence

from pydantic import AfterValidator, Field, create_model, field_validator, model_validator

from headwise.config import Config
from headwise.layer_shape import LayerShape, divisors
import headwise.model as model_package
from headwise.model.attention import ATTENTION_KINDS, AttentionKind
from headwise.model.features import ACTIVATIONS, EMBEDDING_NORMS, NORMS, OUTPUT_GATES, POSITIONS, QK_NORMS
from headwise.parts import FRONT_END_PARTS, OUTPUT_HEAD_PARTS, FrontEndPart, OutputHeadPart
from headwise.registry import Registry

#: Options the model reads only under one setting of another field (a block feature's, see
#: :mod:`headwise.model.features`): option -> (that field, the setting). Set away from its default
#: under any other setting, an option is refused, not ignored.
READ_ONLY_WITH = {key: ("positions", name) for name, setting in POSITIONS.items() for key in setting.options}


def _built_in_kinds() -> dict[str, type[AttentionKind]]:
    """The attention kinds of ``headwise.model``'s ``attention_*`` modules (each registers its
    kind on import: found by listing the folder, so no file lists them)."""
    for info in pkgutil.iter_modules(model_package.__path__, f"{model_package.__name__}."):
        if info.name.rsplit(".", 1)[1].startswith("attention_"):
            importlib.import_module(info.name)
    return dict(ATTENTION_KINDS.items())


#: The built-in attention kinds: their options are ModelSpec's fields, checked in every spec.
_BUILT_IN_KINDS = _built_in_kinds()
#: The kind of every layer of a spec that names none: the built-in kind declared ``default``.
DEFAULT_KIND = next(name for name, kind in _BUILT_IN_KINDS.items() if kind.default)


def attention_kinds() -> Registry[type[AttentionKind]]:
    """Every attention kind, every family's included: the names ``attention`` accepts. A family's
    kinds register when its model modules load (imported here: the families, and torch, load
    only when a name is not a built-in kind's)."""
    from headwise.families import import_family_modules
    from headwise.parts import FAMILY_MODULES

    import_family_modules(FAMILY_MODULES)
    return ATTENTION_KINDS


def _known_kind(name: str) -> str:
    """``name`` if it names a registered attention kind whose options are ModelSpec fields."""
    if name not in ATTENTION_KINDS and name not in attention_kinds():
        raise ValueError(ATTENTION_KINDS.unknown(name))
    missing = sorted(set(ATTENTION_KINDS[name].options) - set(ModelSpec.model_fields))
    if missing:
        raise ValueError(f"attention kind {name!r} declares options {', '.join(missing)}, which ModelSpec does not "
                         "have: only headwise.model's kinds add fields; a family's kind reads the fields there are")
    return name


#: The name of a registered attention kind (:data:`headwise.model.attention.ATTENTION_KINDS`).
AttentionKindName = Annotated[str, AfterValidator(_known_kind)]


def front_ends() -> Registry[FrontEndPart]:
    """The declared input front ends by name, every family's included: the single source of the
    names ``inputs`` accepts (:data:`headwise.parts.FRONT_END_PARTS`)."""
    return FRONT_END_PARTS


def output_heads() -> Registry[OutputHeadPart]:
    """The declared output heads by name, every family's included: the single source of the
    names ``outputs`` accepts (:data:`headwise.parts.OUTPUT_HEAD_PARTS`)."""
    return OUTPUT_HEAD_PARTS


def _registered(name: str, registry: Registry[Any]) -> str:
    if name not in registry:
        names = [repr(n) for n in registry.names()]
        raise ValueError(f"Input should be {', '.join(names[:-1])} or {names[-1]}")
    return name


class ModelSpec(Config):
    """A transformer with per-layer head counts and head widths.

    ``inputs`` chooses the front end and ``outputs`` the head. ``inputs="vectors"`` (or
    ``vocab_size=None``) makes a vector model: inputs and outputs are ``d_model``-vectors, with no
    embedding or output head, for synthetic tasks such as nearest-neighbour search.
    ``inputs="images"`` makes a ViT: square images of ``image_size`` pixels and ``channels``
    channels cut into ``patch_size`` patches, classified into ``num_classes`` classes from the
    class token (``pooling="cls"``) or the mean of the patch tokens (``"mean"``, no class token);
    its ``max_seq_len`` is the number of positions, patches plus class token, and is set from them.
    """

    #: the input front end (a name in :func:`front_ends`)
    inputs: str = "tokens"
    #: The output head (a name in :func:`output_heads`); None: the front end's ``default_outputs``.
    outputs: str | None = None
    vocab_size: int | None = Field(default=50257, gt=0)
    d_model: int = Field(gt=0)
    n_layers: int = Field(gt=0)
    max_seq_len: int = Field(default=2048, gt=0)
    heads: list[int]
    #: Key/value heads (grouped-query attention), one for every layer or a per-layer list; each
    #: layer's query heads must be a multiple of its KV heads (1: multi-query). None: one key/value
    #: head per query head (multi-head attention, the fused [3, heads, head_dim] projection).
    kv_heads: int | list[int] | None = None
    #: None: d_model / heads[i] (the standard tie); an int or a per-layer list: decoupled widths.
    head_dim: int | list[int] | None = None
    #: MLP hidden width, one for all layers or per layer; None: mlp_ratio * d_model.
    mlp_hidden: int | list[int] | None = None
    mlp_ratio: float = Field(default=4.0, gt=0)
    #: the settings of the block features are their records' names (:mod:`headwise.model.features`)
    activation: Literal[tuple(ACTIVATIONS)] = "gelu_new"
    #: Per-layer attention kinds (one kind given alone: every layer); None: every layer the default
    #: kind (``global``). Each kind's options are fields too, after these (:func:`_option_fields`).
    attention: list[AttentionKindName] | AttentionKindName | None = None
    causal: bool = True
    score_scale: Literal["none", "inv_sqrt"] = "none"
    norm: Literal[tuple(NORMS)] = "layernorm_pre"
    #: the epsilon of every LayerNorm or RMSNorm (``rms_norm_eps`` in Llama's config)
    layer_norm_eps: float = Field(default=1e-5, gt=0)
    #: the setting's options (``rope``'s ``rope_theta``, ...) are fields too (:func:`_option_fields`)
    positions: Literal[tuple(POSITIONS)] = "learned"
    qk_norm: Literal[tuple(QK_NORMS)] | None = None
    output_gate: Literal[tuple(OUTPUT_GATES)] | None = None
    embedding_norm: Literal[tuple(EMBEDDING_NORMS)] | None = None
    tie_embeddings: bool = True
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    #: stochastic depth (timm's ``drop_path_rate``): in training each block's residual branches are
    #: dropped per sample at a rate rising linearly from 0 at the first block to this at the last;
    #: None (or 0): none
    drop_path: float | None = Field(default=None, ge=0.0, lt=1.0)
    qkv_bias: bool = False
    out_bias: bool = True
    mlp_bias: bool = True
    init_std: float = Field(default=0.02, gt=0)
    #: image inputs: side of the square image in pixels, patch side, channels (1 or 3)
    image_size: int | None = Field(default=None, gt=0)
    patch_size: int | None = Field(default=None, gt=0)
    channels: int | None = Field(default=None, gt=0)
    #: class outputs: number of classes, and what the classifier reads
    num_classes: int | None = Field(default=None, gt=0)
    pooling: Literal["cls", "mean"] = "cls"
    #: class outputs: the classifier's hidden layer (ReLU), as the LRA reference models' 128;
    #: None: one linear map
    classifier_hidden: int | None = Field(default=None, gt=0)
    #: token inputs: the id of padding, which attention and pooling ignore (bidirectional only)
    pad_id: int | None = Field(default=None, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _vector_inputs(cls, data):
        # `attention = "<kind>"`: that kind in every layer (a study varies depth with it set once)
        if isinstance(data, dict) and isinstance(data.get("attention"), str) and isinstance(data.get("n_layers"), int):
            data = {**data, "attention": [data["attention"]] * data["n_layers"]}
        # Either spelling selects a vector model; TOML cannot store None, so `inputs` is what
        # a saved spec keeps.
        if isinstance(data, dict):
            if "vocab_size" in data and data["vocab_size"] is None and data.get("inputs") is None:
                data = {**data, "inputs": "vectors"}
            inputs = _declared(data.get("inputs"), FRONT_END_PARTS)
            if inputs is not None and not inputs.vocabulary:
                data = {**data, "vocab_size": None}
            if inputs is not None and inputs.complete is not None:
                head = _declared(data.get("outputs") or inputs.default_outputs, OUTPUT_HEAD_PARTS)
                data = inputs.complete(data, head)
        return data

    @field_validator("inputs")
    @classmethod
    def _known_inputs(cls, v: str) -> str:
        return _registered(v, front_ends())

    @field_validator("outputs")
    @classmethod
    def _known_outputs(cls, v: str | None) -> str | None:
        return v if v is None else _registered(v, output_heads())

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        n = self.n_layers
        for name in ("heads", "attention"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"{name} has {len(value)} entries but n_layers is {n}: give one per layer")
        for name in ("head_dim", "mlp_hidden", "kv_heads"):
            value = getattr(self, name)
            if isinstance(value, list) and len(value) != n:
                raise ValueError(f"{name} has {len(value)} entries but n_layers is {n}: give one per layer")
        # every built-in kind checks its options; a kind in use, what its layers need
        used = set(self.attention or [])
        for name, kind in sorted({**_BUILT_IN_KINDS, **{k: ATTENTION_KINDS[k] for k in used}}.items()):
            kind.check(self, name in used)
        if self.pad_id is not None and self.causal:
            raise ValueError("pad_id masks padding in bidirectional models: set causal = false or remove pad_id")
        if self.pad_id is not None and self.vocab_size is not None and self.pad_id >= self.vocab_size:
            raise ValueError(f"pad_id {self.pad_id} is outside the vocabulary of {self.vocab_size} tokens")
        for i, h in enumerate(self.heads):
            if h < 1:
                raise ValueError(f"layer {i}: heads = {h}; every layer needs at least 1 head")
            if self.head_dim is None and self.d_model % h:
                valid = ", ".join(str(v) for v in divisors(self.d_model))
                raise ValueError(
                    f"layer {i}: heads = {h} does not divide d_model {self.d_model}; "
                    f"valid counts: {valid} (or set head_dim to decouple head width from d_model)"
                )
        for name in ("head_dim", "mlp_hidden", "kv_heads"):
            value = getattr(self, name)
            if isinstance(value, int) and value < 1:
                raise ValueError(f"{name} = {value}; it must be a positive integer (or left out for the default)")
            for i, v in enumerate(value if isinstance(value, list) else []):
                if v < 1:
                    raise ValueError(f"layer {i}: {name} = {v}; it must be a positive integer")
        head = OUTPUT_HEAD_PARTS[self.output_head]
        if head.vocabulary and self.vocab_size is None:
            raise ValueError(f"outputs = {self.output_head!r} needs token inputs with a vocab_size; a vector model "
                             "has no vocabulary")
        _check_causal("outputs", self.output_head, head.causal, self.causal)
        ACTIVATIONS[self.activation].check(self)
        _check_read(self)
        _check_kv_heads(self)
        POSITIONS[self.positions].check(self)
        if head.pooled and self.num_classes is None:
            raise ValueError(f"outputs = {self.output_head!r} needs num_classes (set it, or let the task's data set it)")
        _check_causal("inputs", self.inputs, FRONT_END_PARTS[self.inputs].causal, self.causal)
        return self

    def _per_layer(self, value: int | list[int] | None) -> list[int | None]:
        """A per-layer field as one entry per layer (None where it is unset)."""
        return list(value) if isinstance(value, list) else [value] * self.n_layers

    def layer(self, i: int) -> LayerShape:
        """The resolved shape of layer ``i``."""
        heads = self.heads[i]
        head_dim = self._per_layer(self.head_dim)[i]
        mlp = self._per_layer(self.mlp_hidden)[i]
        if head_dim is None:
            head_dim = self.d_model // heads
        if mlp is None:
            mlp = int(round(self.mlp_ratio * self.d_model))
        attention = (self.attention or [DEFAULT_KIND] * self.n_layers)[i]
        kv_heads = self._per_layer(self.kv_heads)[i] or heads
        return LayerShape(heads=heads, head_dim=head_dim, mlp_hidden=mlp, attention=attention, kv_heads=kv_heads)

    def layers(self) -> list[LayerShape]:
        """Resolved shapes of every layer."""
        return [self.layer(i) for i in range(self.n_layers)]

    def with_layers(self, layers: Sequence[LayerShape]) -> "ModelSpec":
        """This spec with ``layers`` in place of its own: their depth and heads, and each of head
        width, key/value heads, MLP width and attention kind that the layers set (a field None in
        every layer stays this spec's; None in some layers only is refused)."""
        fields = {**self.model_dump(), "n_layers": len(layers), "heads": [s.heads for s in layers]}
        for name in ("head_dim", "kv_heads", "mlp_hidden", "attention"):
            values = [getattr(s, name) for s in layers]
            if all(v is not None for v in values):
                fields[name] = values
            elif any(v is not None for v in values):
                raise ValueError(f"{name} is set in some layers and not in others: set it in every layer or in none")
        return type(self).model_validate(fields)

    @property
    def output_head(self) -> str:
        """The output head: ``outputs``, or the default of the inputs when it is not set."""
        return self.outputs or FRONT_END_PARTS[self.inputs].default_outputs

    @property
    def total_heads(self) -> int:
        """Heads summed over the layers."""
        return sum(self.heads)

    @property
    def head_dims(self) -> list[int]:
        """The resolved head width of every layer."""
        return [s.head_dim for s in self.layers()]

    @property
    def kv_heads_per_layer(self) -> list[int]:
        """The resolved key/value heads of every layer (its query heads where ``kv_heads`` is None)."""
        return [s.kv_heads for s in self.layers()]

    # What a run does with its model's spec, the same for a model another library builds
    # (:mod:`headwise.model_sources`): the trainer and checkpoints call only these.

    def build(self):
        """The :class:`~headwise.model.transformer.Transformer` of this spec (loads torch)."""
        from headwise.model.transformer import Transformer

        return Transformer(self)

    def parameter_count(self) -> int:
        """The model's parameters, counted from the spec (:func:`headwise.params.count_params`)."""
        from headwise.params import count_params

        return count_params(self)

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token at ``seq_len`` (:func:`headwise.params.flops_per_token`)."""
        from headwise.params import flops_per_token

        return flops_per_token(self, seq_len)

    def kv_cache_budget(self) -> dict[str, int] | None:
        """A causal model's key/value cache per token (:func:`headwise.params.kv_cache_budget`);
        None for a bidirectional one, which decodes nothing."""
        from headwise.params import kv_cache_budget

        return kv_cache_budget(self) if self.causal else None

    def analyze(self, model, batches):
        """Condition numbers, entropies and effective ranks of ``model``'s (this spec's) attention
        on ``batches`` (:func:`headwise.analysis.conditioning.analyze_model`)."""
        from headwise.analysis.conditioning import analyze_model

        return analyze_model(model, batches)

    def heads_line(self) -> str:
        """``heads [..]``, with the key/value heads where they differ: how a run announces its model."""
        kv = self.kv_heads_per_layer
        return f"heads {self.heads}" + ("" if kv == self.heads else f" (key/value heads {kv})")


def _option_fields() -> dict[str, Any]:
    """The options of the positions settings and of the built-in attention kinds as ModelSpec
    fields, name -> (type, Field), each declared once in its setting's record or kind's module."""
    fields: dict[str, Any] = {}
    declared = [(f"positions {name!r}", p.options) for name, p in POSITIONS.items()]
    for owner, options in declared + [(f"attention kind {n!r}", k.options) for n, k in _BUILT_IN_KINDS.items()]:
        for key, option in options.items():
            if key in fields or key in ModelSpec.model_fields:
                raise TypeError(f"{owner} declares option {key!r}, which is already a ModelSpec field")
            fields[key] = (option.type, Field(default=option.default, gt=option.gt, description=option.doc))
    return fields


# The options (``rope_theta``, ``window``, ``landmarks``, ...) follow the fields above: flat keys of
# ``[model]``, as saved configs hold them, while no setting or kind is named here.
ModelSpec = create_model("ModelSpec", __base__=ModelSpec, __module__=__name__, __doc__=ModelSpec.__doc__,
                         **_option_fields())


def _check_read(spec: ModelSpec) -> None:
    """Refuse an option of :data:`READ_ONLY_WITH` set away from its default where the model would
    ignore it, naming the setting it needs."""
    for name, (field, setting) in READ_ONLY_WITH.items():
        value, current = getattr(spec, name), getattr(spec, field)
        if value != type(spec).model_fields[name].default and current != setting:
            raise ValueError(f"{name} = {value} has no effect with {field} = {current!r}: set {field} = "
                             f"{setting!r}, or remove {name}")


def _check_kv_heads(spec: ModelSpec) -> None:
    """What grouped-query attention needs of each layer's heads, naming the first layer that fails."""
    for i, s in enumerate(spec.layers()):
        if s.heads % s.kv_heads:
            valid = ", ".join(str(v) for v in divisors(s.heads))
            raise ValueError(f"layer {i}: heads = {s.heads} is not a multiple of kv_heads = {s.kv_heads}; each "
                             f"key/value head serves an equal group of query heads: valid kv_heads {valid}")


def _declared(name: object, parts: Registry[Any]) -> Any:
    """The declaration of a part named in a spec's raw fields; None for a missing or unknown name
    (which the field's own check refuses)."""
    return parts[name] if isinstance(name, str) and name in parts else None


def _check_causal(field: str, name: str, needed: bool | None, causal: bool) -> None:
    """Refuse a ``causal`` setting the part named by ``field`` cannot work with."""
    if needed is not None and needed != causal:
        want = str(needed).lower()
        raise ValueError(f"{field} = {name!r} needs causal = {want}: set causal = {want}")

