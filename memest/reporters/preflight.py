"""A pre-flight result as every surface lays it out: the CLI's text table and the service's
pre-flight page read the same rows and lines from here (figures formatted by memest.units)."""

from __future__ import annotations

from pydantic import BaseModel

from memest.estimate.kv_groups import Lengths, group_rows
from memest.estimate.phases import TERM_LABELS
from memest.preflight.calibration import overshoot_line
from memest.reporters.kv_groups import kv_groups_table
from memest.reporters.table import text_lines
from memest.reporters.views import FAMILY_TERMS
from memest.schema.estimate import GrowableKvPrediction
from memest.schema.preflight import PreflightResult, PreflightTerm
from memest.units import concurrency_text, fmt_gib


class TermLine(BaseModel):
    """One row of the term table: its label, bytes, half-width and how it was predicted."""

    name: str
    label: str
    bytes: int
    uncertainty_bytes: int | None = None
    law: str = ""


def _shown(r: PreflightResult, t: PreflightTerm) -> bool:
    family = FAMILY_TERMS.get(t.name)
    return family is None or family == r.family or t.bytes != 0


def term_lines(r: PreflightResult) -> list[TermLine]:
    """The budget, each predicted term (a zero term of another family left off), then non-KV."""
    rows = [
        TermLine(
            name="requested_bytes",
            label=TERM_LABELS["requested_bytes"],
            bytes=r.terms.requested_bytes,
        )
    ]
    rows += [
        TermLine(
            name=t.name,
            label=TERM_LABELS.get(t.name, t.name),
            bytes=t.bytes,
            uncertainty_bytes=t.uncertainty_bytes,
            law=t.law,
        )
        for t in r.term_details
        if _shown(r, t)
    ]
    rows.append(TermLine(name="non_kv_bytes", label="non-KV", bytes=r.non_kv_bytes))
    return rows


def heading_lines(r: PreflightResult) -> list[str]:
    """What was predicted: the model, GPU and calibration, then the grid."""
    spec = f" + {r.speculative_method} K={r.num_speculative_tokens}" if r.speculative_method else ""
    blocks = f"{r.block_size}-token KV blocks ({r.attention_backend})"
    groups = r.kv_cache.groups
    if groups and groups[0].block_size != r.block_size:
        # a hybrid's groups share one page size: vLLM scales the attention block up to it
        blocks = (
            f"{groups[0].block_size}-token KV blocks (one page for every group; "
            f"{r.attention_backend}'s kernel block {r.block_size})"
        )
    return [
        f"{r.model} ({r.family}){spec} on {r.gpu}, TP {r.tensor_parallel_size}, per rank; "
        f"calibration {r.calibration}",
        f"grid: {r.max_num_seqs} seqs, {r.max_num_batched_tokens} batched tokens, "
        f"max_model_len {r.max_model_len}, utilization {r.gpu_memory_utilization}, "
        f"{r.total_graphs} CUDA graphs, {blocks}",
    ]


def kv_line(r: PreflightResult) -> str:
    """The KV cache one rank gets, its range, tokens and concurrency."""
    return (
        f"KV cache per rank: {fmt_gib(r.kv_cache_bytes)} GiB ± "
        f"{fmt_gib(r.kv_cache_uncertainty_bytes)}: {r.kv_tokens:,} tokens "
        f"({r.kv_tokens_low:,} to {r.kv_tokens_high:,}), {r.kv_bytes_per_token:,} B per token"
        f"{' of the block pool' if r.kv_cache.groups else ''}, "
        f"max concurrency {concurrency_text(r.max_concurrency, r.max_model_len)}"
    )


def closing_lines(r: PreflightResult) -> list[str]:
    """How vLLM's own estimate compared on the calibration's starts, then the notes."""
    lines = [overshoot_line(r.vllm_overshoot)] if r.vllm_overshoot is not None else []
    return lines + growable_lines(r) + [f"note: {n}" for n in r.notes]


def growable_lines(r: PreflightResult) -> list[str]:
    """vLLM 0.34's growable KV cache: its own sizing beside memest's (none on other releases)."""
    g = r.growable_kv
    return [] if g is None or r.vllm_version is None else [growable_line(r.vllm_version, g)]


def growable_line(version: str, g: GrowableKvPrediction) -> str:
    """One growable-cache prediction in words (the pre-flight's, the what-if's at G')."""
    return (
        f"vLLM {version}, growable KV cache at utilization {g.gpu_memory_utilization}: "
        f"vLLM's sizing commits {fmt_gib(g.vllm_kv_bytes)} GiB ({g.vllm_kv_tokens:,} tokens), "
        f"keeping the {fmt_gib(g.transient_peak_bytes)} GiB transient peak and a "
        f"{fmt_gib(g.vllm_margin_bytes)} GiB margin free; memest's sizing commits "
        f"{fmt_gib(g.memest_kv_bytes)} GiB ({g.memest_kv_tokens:,} tokens, margin "
        f"{fmt_gib(g.memest_margin_bytes)} GiB) with {g.memest_flag}"
    )


def render(r: PreflightResult) -> str:
    """The result as a text table: `memest preflight`'s output."""
    lines = [*heading_lines(r), "", f"{'term':<42}{'GiB':>9}{'± GiB':>9}  law"]
    for row in term_lines(r):
        unc = "" if row.uncertainty_bytes is None else f"{fmt_gib(row.uncertainty_bytes):>9}"
        law = f"  {row.law}" if row.law else ""
        lines.append(f"{row.label:<42}{fmt_gib(row.bytes):>9}{unc}{law}".rstrip())
    lines += ["", kv_line(r), f"vLLM flag: {r.kv_cache_flag}", *group_lines(r), *closing_lines(r)]
    return "\n".join(lines)


def group_lines(r: PreflightResult) -> list[str]:
    """A hybrid's KV cache per group (memest.reporters.kv_groups); none for one group."""
    if not r.kv_cache.groups:
        return []
    lengths = Lengths(r.max_model_len, r.max_num_batched_tokens)
    table = kv_groups_table(group_rows(r.kv_cache, r.kv_budget_bytes, lengths), r.max_model_len)
    return ["", *text_lines([table])] if table is not None else []
