"""The key/value cache in the ``depth`` layout's headline table (issue 34): each variant's KV heads
per layer and the bytes its cache grows by per token, against the baseline.

The bytes are what the run recorded (``kv_cache_bytes_per_token`` in ``summary.json``, from
:func:`headwise.params.kv_cache_budget`), never recomputed here, so the table shows what trained;
summaries written before that field existed read "n/a". The KV heads per layer are the plan's
(the ``layerwise`` scheme sets them) or the run config's ``model.kv_heads``, where a saved config
keeps the whole spec (an absent ``kv_heads`` is multi-head attention: one KV head per query head).

The columns are drawn only where they tell something: when a listed variant shares its KV heads
among query heads (grouped-query or multi-query attention), or the recorded bytes differ between
the listed variants. A table of multi-head models whose caches match, or whose summaries predate
the record, stays as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headwise.errors import HeadwiseError
from headwise.presets import preset_dict
from headwise.report import stats
from headwise.report.data import VariantRuns

#: the cell of a fact a run did not record (a summary older than the KV-cache field)
NOT_RECORDED = "n/a"
#: the dtypes :func:`headwise.params.kv_cache_budget` records, in the order the CSV lists them
RECORDED_DTYPES = ("fp32", "bf16")


def kv_record(v: VariantRuns) -> dict[str, int] | None:
    """The KV-cache bytes per token the variant's runs recorded, by dtype (None when they did not:
    older summaries, and bidirectional models, which keep no cache). Every seed shares the spec,
    so one run's summary stands for the variant."""
    run = v.info
    return None if run is None or run.summary is None else run.summary.kv_cache_bytes_per_token


def kv_heads_per_layer(v: VariantRuns) -> list[int] | None:
    """The variant's key/value heads per layer; None when nothing says (no summary or no config)."""
    plan, run = v.plan, v.info
    if plan is None or run is None:
        return None
    if plan.kv_heads:  # the layerwise scheme's own
        return list(plan.kv_heads)
    model = run.config.get("model")
    if not isinstance(model, dict):
        return None
    value = model.get("kv_heads")
    if "kv_heads" not in model and model.get("preset"):
        # a config as a study writes it, before the trainer resolves it: the preset's value stands
        try:
            value = preset_dict(model["preset"]).get("kv_heads")
        except HeadwiseError:
            return None
    if value is None:
        return list(plan.heads)  # multi-head attention
    if isinstance(value, int):
        return [value] * plan.n_layers
    return [int(k) for k in value] if len(value) == plan.n_layers else None


def kv_heads_cell(kv: list[int] | None) -> str:
    """KV heads per layer: one number when every layer has it, else the list."""
    if not kv:
        return NOT_RECORDED
    return str(kv[0]) if len(set(kv)) == 1 else ", ".join(map(str, kv))


@dataclass(frozen=True)
class KVColumns:
    """Whether and how the headline table shows the KV cache, decided once for its variants."""

    #: draw the markdown columns (the CSV always has them)
    shown: bool
    #: the dtype of the table's bytes column: the runs' training precision where recorded
    dtype: str
    #: the dtypes the CSV lists, one column each
    dtypes: tuple[str, ...]
    #: whether ``dtype`` is the runs' training precision (else fp32 stands in: the note says which)
    is_precision: bool = True
    #: whether a variant's summary lacks the record (its cell reads :data:`NOT_RECORDED`)
    missing: bool = False

    @classmethod
    def of(cls, variants: list[VariantRuns]) -> "KVColumns":
        """The columns for ``variants``, the baseline first (its precision picks the dtype)."""
        records = [r for r in map(kv_record, variants) if r is not None]
        recorded = list(dict.fromkeys(d for r in records for d in r))
        dtypes = tuple(dict.fromkeys([*RECORDED_DTYPES, *recorded]))
        # a bf16 run's cache would be bf16 when it decodes: show the bytes it would hold
        precision = next((v.info.summary.precision for v in variants if v.info and v.info.summary), "fp32")
        dtype = next((d for d in (precision, "fp32", *recorded) if d in recorded), "fp32")
        distinct = {r.get(dtype) for r in records} - {None}
        shared = any(kv_heads_per_layer(v) not in (None, v.heads) for v in variants)  # GQA or MQA somewhere
        return cls(shown=len(distinct) > 1 or shared, dtype=dtype, dtypes=dtypes, is_precision=dtype == precision,
                   missing=len(records) < len(variants))

    @property
    def headers(self) -> list[str]:
        return ["KV heads per layer", f"KV cache / token ({self.dtype})"]

    def bytes_of(self, v: VariantRuns, dtype: str | None = None) -> int | None:
        """The variant's recorded bytes per token in ``dtype`` (the table's by default)."""
        record = kv_record(v)
        return None if record is None else record.get(dtype or self.dtype)

    def difference(self, v: VariantRuns, base: VariantRuns | None) -> float | None:
        """The variant's cache against the baseline's, in percent (None where either is not recorded).
        Every recorded dtype scales the same element count, so one percentage holds for all."""
        b, mine = (self.bytes_of(base) if base is not None else None), self.bytes_of(v)
        return stats.percent_difference(mine, b) if mine is not None and b else None

    def cells(self, v: VariantRuns, base: VariantRuns | None) -> list[str]:
        """The variant's two cells: its KV heads, and its bytes with the difference from ``base``
        (none on the baseline's own row, as the parameters column)."""
        n = self.bytes_of(v)
        cell = NOT_RECORDED if n is None else f"{n:,} B"
        d = self.difference(v, base) if v is not base else None
        return [kv_heads_cell(kv_heads_per_layer(v)), cell + (f" ({d:+.0f}%)" if d is not None else "")]

    def csv_fields(self, v: VariantRuns, base: VariantRuns | None) -> dict[str, Any]:
        """The variant's KV facts for the table's CSV (empty cells where not recorded)."""
        kv = kv_heads_per_layer(v)
        row: dict[str, Any] = {"kv_heads": " ".join(map(str, kv)) if kv else None}
        row.update({f"kv_cache_{d}_bytes": self.bytes_of(v, d) for d in self.dtypes})
        row["kv_cache_vs_baseline_pct"] = self.difference(v, base) if v is not base else None
        return row

    def note(self) -> str:
        """What the bytes column counts, for below the table."""
        other = [d for d in self.dtypes if d != self.dtype]
        return ("KV cache / token: the bytes the key/value cache grows by per generated token, as each run recorded "
                "them (2 x KV heads x head_dim x bytes per element, summed over the layers), in "
                f"{self.dtype}" + (", the runs' training precision" if self.is_precision else "")
                + (f"; the CSV has {', '.join(other)} too" if other else "")
                + "." + (f" {NOT_RECORDED}: the run's summary predates the record." if self.missing else ""))
