"""Every MEMEST_* setting the vLLM plugin reads, with its help text.

The plugin runs inside ``vllm serve`` worker processes, so it is configured only through the
environment. ``Settings.from_env`` never raises: a malformed value (a number that is not finite,
or below its minimum; a run id that is not a safe folder name) falls back to its default and the
problem is kept in ``Settings.problems`` (the plugin logs it once and records it in the report).
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from memest.errors import ConfigError
from memest.runid import check_run_id

#: Longest MEMEST_PUSH_TIMEOUT_S: a push holds up the end of vLLM's startup by at most this.
MAX_PUSH_TIMEOUT_S = 600.0

EstimateMode = Literal["off", "apply", "plan"]
ESTIMATE_MODES: tuple[EstimateMode, ...] = ("off", "apply", "plan")


@dataclass(frozen=True)
class EnvVar:
    """One documented setting."""

    name: str
    default: str
    help: str


ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar("MEMEST_ENABLE", "0", "1 turns the plugin on; anything else leaves vLLM untouched."),
    EnvVar(
        "MEMEST_OUTPUT_DIR",
        "memest-out",
        "Folder for reports: <dir>/<run id>/report.rank<N>.json (and the push spool).",
    ),
    EnvVar(
        "MEMEST_RUN_ID",
        "",
        "Run id shared by every rank of one launch: 1-128 letters, digits, '.', '_' or '-', "
        "starting with a letter or digit (it names a folder). Empty or not such a name: derived "
        "per launch from launch-wide values (torchelastic/NCCL/vLLM ports, the parent process's "
        "pid and start time), identical on all ranks and new for every launch.",
    ),
    EnvVar(
        "MEMEST_SERVICE_URL",
        "",
        "memest service base URL (http:// or https:// and a host); reports are POSTed to "
        "{url}/api/v1/reports. Empty, or not such a URL (named in the report's problems): no push.",
    ),
    EnvVar(
        "MEMEST_TOKEN",
        "",
        "Bearer token sent with each push: the service's push-only MEMEST_PUSH_TOKEN.",
    ),
    EnvVar(
        "MEMEST_PUSH_TIMEOUT_S",
        "10",
        "Upper bound in seconds on the whole push of one report (every attempt, wait and "
        "read, and rank 0's delivery of the spool), at most 600; the report is spooled to "
        "<output dir>/spool/ when it runs out.",
    ),
    EnvVar("MEMEST_PUSH_RETRIES", "3", "Push attempts before spooling (backoff 0.5 s, doubling)."),
    EnvVar(
        "MEMEST_HISTORY_MAX_ENTRIES",
        "2000000",
        "Allocator history entries kept (0 turns history, the trigger table and the retained "
        "view off; phase and pool readings remain).",
    ),
    EnvVar(
        "MEMEST_HISTORY_FROM",
        "off",
        "Allocator history, which the trigger table, owners and the retained view need: off "
        "(stage growth from pool readings only; the cheapest start), graph_profiling (from "
        "graph-memory profiling on: the capture windows; a warm Llama-8B start took 31 s "
        "instead of 24 s) or init (every event from init_device on; slower still).",
    ),
    EnvVar("MEMEST_RULES", "", "Owner-rules file for the analysis (default rules when empty)."),
    EnvVar(
        "MEMEST_KEEP_SNAPSHOT",
        "0",
        "1 also writes the allocator history (memest JSON, gzip) beside each report as "
        "snapshot.rank<N>.json.gz, so `memest analyze` can rerun the breakdown offline.",
    ),
    EnvVar(
        "MEMEST_ESTIMATE",
        "plan",
        "off: measure only. plan: at the end of init, write a vLLM startup plan and the "
        "matching --kv-cache-memory-bytes into the report. apply: also replace vLLM's "
        "graph-memory estimate with memest's full-initialization measurement in this start. "
        "plan and apply run one extra, warm profile pass to read the activation headroom.",
    ),
    EnvVar(
        "MEMEST_MARGIN_BYTES",
        "0",
        "Bytes memest keeps free on top of its measured terms (apply mode and startup plans).",
    ),
    EnvVar(
        "MEMEST_PLAN_FREE_TOLERANCE_BYTES",
        "268435456",
        "The startup plan's free-memory baseline is written this far below the measured one, "
        "so a next start with a few MiB less free memory still applies it.",
    ),
    EnvVar(
        "MEMEST_PLAN_PATH_SPLIT",
        "1",
        "1 runs vLLM's profile run on its kv_cache_memory_bytes path (a startup plan applied, "
        "--kv-cache-memory-bytes) under the 20 MiB split limit and the emptied cache its "
        "profiling path has, so growing workspaces do not pin freed segments beyond what the "
        "plan was sized for; 0 leaves that path as vLLM runs it.",
    ),
    EnvVar(
        "MEMEST_WORK_BUDGET_S",
        "60",
        "Seconds of its own work memest may add to one start. Past it, optional work (allocator "
        "history, per-pool readings, the warm profile pass, the end-of-init analysis) is shed "
        "and the report says so; vLLM's start is never held up further.",
    ),
    EnvVar(
        "MEMEST_SLOW_HOOK_S",
        "20",
        "A memest hook still running after this many seconds is logged once with its stack "
        "(watchdog thread), so a slow hook is visible while it runs.",
    ),
    EnvVar(
        "MEMEST_CODE_MAP_DIR",
        "~/.cache/memest/compiled-code",
        "Folder where the map of each torch.compile-generated module (its FX nodes' module "
        "paths) is kept by the module's content hash, so a start that loads the code from "
        "vLLM's compile cache names the same owners as the start that compiled it.",
    ),
    EnvVar(
        "MEMEST_FAULT",
        "",
        "Testing only: comma-separated hook names made to raise (fault injection); "
        "'all' makes every hook raise.",
    ),
)


def help_text() -> str:
    """All settings as ``NAME (default): help`` lines."""
    return "\n".join(f"{v.name} (default {v.default!r}): {v.help}" for v in ENV_VARS)


def _default(name: str) -> str:
    for var in ENV_VARS:
        if var.name == name:
            return var.default
    raise KeyError(name)


def _estimate_default() -> EstimateMode:
    mode = _default("MEMEST_ESTIMATE")
    # ENV_VARS names one of the modes (test_env checks); never raise at import inside vLLM
    return mode if mode in ESTIMATE_MODES else "off"


def _switch(name: str, text: str, problems: list[str]) -> bool:
    """A 0/1 setting; anything else keeps the default and is named in ``problems``."""
    if text in ("0", "1"):
        return text == "1"
    problems.append(f"{name}={text!r}: expected 0 or 1")
    return _default(name) == "1"


@dataclass(frozen=True)
class Settings:
    """The plugin's settings, read once per process; each default is ENV_VARS' (declared once)."""

    enabled: bool = _default("MEMEST_ENABLE") == "1"
    output_dir: str = _default("MEMEST_OUTPUT_DIR")
    run_id: str = _default("MEMEST_RUN_ID")
    service_url: str = _default("MEMEST_SERVICE_URL")
    token: str = _default("MEMEST_TOKEN")
    push_timeout_s: float = float(_default("MEMEST_PUSH_TIMEOUT_S"))
    push_retries: int = int(_default("MEMEST_PUSH_RETRIES"))
    history_max_entries: int = int(_default("MEMEST_HISTORY_MAX_ENTRIES"))
    history_from: str = _default("MEMEST_HISTORY_FROM")
    rules_file: str = _default("MEMEST_RULES")
    keep_snapshot: bool = _default("MEMEST_KEEP_SNAPSHOT") == "1"
    estimate: EstimateMode = _estimate_default()
    margin_bytes: int = int(_default("MEMEST_MARGIN_BYTES"))
    plan_free_tolerance_bytes: int = int(_default("MEMEST_PLAN_FREE_TOLERANCE_BYTES"))
    plan_path_split: bool = _default("MEMEST_PLAN_PATH_SPLIT") == "1"
    work_budget_s: float = float(_default("MEMEST_WORK_BUDGET_S"))
    slow_hook_s: float = float(_default("MEMEST_SLOW_HOOK_S"))
    code_map_dir: str = _default("MEMEST_CODE_MAP_DIR")
    faults: frozenset[str] = frozenset()
    problems: tuple[str, ...] = field(default=())

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read the settings; a bad value keeps its default and is named in ``problems``."""
        env = os.environ if environ is None else environ
        problems: list[str] = []

        def raw(name: str) -> str:
            return env.get(name, _default(name)).strip()

        def integer(name: str, minimum: int = 0) -> int:
            text = raw(name)
            try:
                value = int(text)
                if value < minimum:
                    raise ValueError
                return value
            except ValueError:
                problems.append(
                    f"{name}={text!r}: expected an integer >= {minimum}; "
                    f"the default {_default(name)} is used"
                )
                return int(_default(name))

        def number(name: str, maximum: float = math.inf) -> float:
            text = raw(name)
            try:
                value = float(text)
                if not math.isfinite(value) or not 0 < value <= maximum:  # float() takes "nan"
                    raise ValueError
                return value
            except ValueError:
                most = f" at most {maximum:g}" if math.isfinite(maximum) else ""
                problems.append(
                    f"{name}={text!r}: expected a finite positive number{most}; "
                    f"the default {_default(name)} is used"
                )
                return float(_default(name))

        mode_text = raw("MEMEST_ESTIMATE").lower()
        mode = _estimate_default()
        if mode_text in ESTIMATE_MODES:
            mode = mode_text
        else:
            problems.append(f"MEMEST_ESTIMATE={mode_text!r}: expected one of off, apply, plan")
        history_from = raw("MEMEST_HISTORY_FROM").lower()
        if history_from not in ("off", "graph_profiling", "init"):
            problems.append(
                f"MEMEST_HISTORY_FROM={history_from!r}: expected off, graph_profiling or init"
            )
            history_from = _default("MEMEST_HISTORY_FROM")
        faults = frozenset(f.strip() for f in raw("MEMEST_FAULT").split(",") if f.strip())
        return cls(
            enabled=raw("MEMEST_ENABLE") == "1",
            output_dir=raw("MEMEST_OUTPUT_DIR") or _default("MEMEST_OUTPUT_DIR"),
            run_id=_run_id(raw("MEMEST_RUN_ID"), problems),
            service_url=_service_url(raw("MEMEST_SERVICE_URL"), problems),
            token=raw("MEMEST_TOKEN"),
            push_timeout_s=number("MEMEST_PUSH_TIMEOUT_S", MAX_PUSH_TIMEOUT_S),
            push_retries=integer("MEMEST_PUSH_RETRIES", 1),
            history_max_entries=integer("MEMEST_HISTORY_MAX_ENTRIES", 0),
            history_from=history_from,
            rules_file=raw("MEMEST_RULES"),
            keep_snapshot=raw("MEMEST_KEEP_SNAPSHOT") == "1",
            estimate=mode,
            margin_bytes=integer("MEMEST_MARGIN_BYTES", 0),
            plan_free_tolerance_bytes=integer("MEMEST_PLAN_FREE_TOLERANCE_BYTES", 0),
            plan_path_split=_switch(
                "MEMEST_PLAN_PATH_SPLIT", raw("MEMEST_PLAN_PATH_SPLIT"), problems
            ),
            work_budget_s=number("MEMEST_WORK_BUDGET_S"),
            slow_hook_s=number("MEMEST_SLOW_HOOK_S"),
            code_map_dir=raw("MEMEST_CODE_MAP_DIR") or _default("MEMEST_CODE_MAP_DIR"),
            faults=faults,
            problems=tuple(problems),
        )


def _service_url(text: str, problems: list[str]) -> str:
    """MEMEST_SERVICE_URL when it is an http(s) URL with a host (without a trailing slash); else
    empty (no push), the problem kept: a junk value would fail every push attempt unseen."""
    if not text:
        return ""
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        problems.append(
            f"MEMEST_SERVICE_URL={text[:200]!r}: expected http://HOST[:PORT] or https://...; "
            "reports are not pushed"
        )
        return ""
    if parts.query or parts.fragment or any(c.isspace() for c in text):
        problems.append(
            f"MEMEST_SERVICE_URL={text[:200]!r}: a base URL has no query, fragment or spaces; "
            "reports are not pushed"
        )
        return ""
    return text.rstrip("/")


def _run_id(text: str, problems: list[str]) -> str:
    """MEMEST_RUN_ID when it is a safe folder name; else empty (a derived id), the problem kept."""
    if not text:
        return ""
    try:
        return check_run_id(text)
    except ConfigError as exc:
        problems.append(f"{exc}; a run id derived for this launch is used instead")
        return ""


_LAUNCH_KEYS = (
    "TORCHELASTIC_RUN_ID",
    "MASTER_ADDR",
    "MASTER_PORT",
    "VLLM_DP_MASTER_PORT",
    "VLLM_PORT",
)


def derive_run_id(
    environ: Mapping[str, str] | None = None,
    *,
    parent_pid: int | None = None,
    proc_root: str = "/proc",
) -> str:
    """A run id that is new for every launch and identical on every rank of it.

    MEMEST_RUN_ID wins when it is a safe folder name (memest.runid; Settings.from_env names a
    bad one). Otherwise the id hashes launch-wide values that all ranks share
    (torchelastic run id, rendezvous address and ports) and the launching process: vLLM's
    workers are children of the engine core, so they share its pid *and* its start time. The
    start time (and the boot id) make the id new when a re-run, or a restarted container whose
    processes get the same pids, launches the same configuration again.
    """
    env = os.environ if environ is None else environ
    explicit = _run_id(env.get("MEMEST_RUN_ID", "").strip(), [])
    if explicit:
        return explicit
    parts = [f"{k}={env[k]}" for k in _LAUNCH_KEYS if env.get(k)]
    ppid = os.getppid() if parent_pid is None else parent_pid
    parts.append(f"ppid={ppid}")
    parts.append(f"started={process_start_ticks(ppid, proc_root)}")
    parts.append(f"boot={_read_text(f'{proc_root}/sys/kernel/random/boot_id')}")
    digest = hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]
    return f"run-{digest}"


def process_start_ticks(pid: int, proc_root: str = "/proc") -> str:
    """Field 22 of /proc/<pid>/stat: the process start time in clock ticks since boot.

    Empty where /proc is missing (the id then repeats across launches; set MEMEST_RUN_ID).
    """
    stat = _read_text(f"{proc_root}/{pid}/stat")
    # The command name (field 2) is in parentheses and may hold spaces: split after its ')'.
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else ""


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read(4096).strip()
    except OSError:
        return ""
