"""The per-runner capture-plan table: the seed's sizing beside vLLM 0.33.0's ("main").

``PlanTable.from_plans(seed, main)`` pairs rows by (runner, q, tier); ``.data`` holds the rows;
``render()`` draws a fixed-width text table.
"""

from __future__ import annotations

from dataclasses import dataclass

from memest.reporters.table import Align, Table, text_grid
from memest.schema.plan import CapturePlan, RunnerRow


def _widest(row: RunnerRow | None) -> str:
    if row is None:
        return "–"
    if row.graph_count == 0:
        return "none"
    if row.unit == "requests":
        return f"{row.widest_requests} × q={row.q} = {row.widest_tokens}"
    return f"{row.widest_tokens} tok"


def _count(row: RunnerRow | None) -> str:
    return "–" if row is None else str(row.graph_count)


def _sum(row: RunnerRow | None) -> str:
    return "–" if row is None else f"{row.sum_tokens:,}"


@dataclass(frozen=True)
class PlanTableRow:
    """One runner (one tier with dynamic SD), both sizings."""

    runner: str
    label: str
    mode: str
    q: int
    tier_k: int | None
    seed: RunnerRow | None
    main: RunnerRow | None


@dataclass(frozen=True)
class PlanTable:
    """Rows of the side-by-side table plus both plans' totals and warnings."""

    data: list[PlanTableRow]
    seed: CapturePlan
    main: CapturePlan

    @classmethod
    def from_plans(cls, seed: CapturePlan, main: CapturePlan) -> PlanTable:
        """Pair the rows of two plans for the same input."""
        order: list[tuple[str, int, int | None]] = []
        by_key: dict[tuple[str, int, int | None], dict[str, RunnerRow]] = {}
        for side, plan in (("seed", seed), ("main", main)):
            for row in plan.runners:
                key = (row.runner, row.q, row.tier_k)
                if key not in by_key:
                    by_key[key] = {}
                    order.append(key)
                by_key[key][side] = row
        rows = []
        for key in order:
            pair = by_key[key]
            first = pair.get("seed") or pair["main"]
            rows.append(
                PlanTableRow(
                    runner=key[0],
                    label=first.label,
                    mode=first.graph_mode,
                    q=key[1],
                    tier_k=key[2],
                    seed=pair.get("seed"),
                    main=pair.get("main"),
                )
            )
        return cls(rows, seed, main)

    def render(self) -> str:
        """A fixed-width table: runner, mode, q, then graphs / widest / Σ tokens per sizing."""
        header = [
            "runner",
            "mode",
            "q",
            "seed graphs",
            "seed widest",
            "seed Σ tokens",
            "main graphs",
            "main widest",
            "main Σ tokens",
        ]
        body = []
        for r in self.data:
            name = r.runner if r.tier_k is None else f"{r.runner} (K={r.tier_k})"
            body.append(
                [
                    name,
                    r.mode,
                    str(r.q),
                    _count(r.seed),
                    _widest(r.seed),
                    _sum(r.seed),
                    _count(r.main),
                    _widest(r.main),
                    _sum(r.main),
                ]
            )
        body.append(
            [
                "total",
                "",
                "",
                str(self.seed.total_graphs),
                "",
                "",
                str(self.main.total_graphs),
                "",
                "",
            ]
        )
        right: Align = "right"
        align = tuple(right if i in {2, 3, 5, 6, 8} else None for i in range(len(header)))
        out = text_grid(Table("", header, body, align=align))
        p = self.seed
        title = (
            f"Capture plan · {p.gpu} ({'SM100' if p.sm100 else 'not SM100'}) · "
            f"max_num_seqs {p.max_num_seqs} · max_num_batched_tokens {p.max_num_batched_tokens}"
        )
        if p.speculative_method:
            title += f" · {p.speculative_method} K={p.num_speculative_tokens}"
        if p.adaptive_verification:
            title += " · adaptive verification"
        if p.dynamic_sd_schedule:
            title += f" · dynamic SD {p.dynamic_sd_schedule}"
        lines = [title, "seed = the five capture fields; main = vLLM 0.33.0", "", *out]
        recorded = (
            f"recorded max_cudagraph_capture_size: seed {self.seed.max_cudagraph_capture_size}, "
            f"main {self.main.max_cudagraph_capture_size}"
        )
        lines += ["", recorded]
        for side, plan in (("seed", self.seed), ("main", self.main)):
            lines += [f"warning ({side}): {w}" for w in plan.warnings]
        return "\n".join(lines) + "\n"
