"""Owner rules: which stack frame makes an allocation belong to which owner.

Rules are data. Each rule names an owner and glob patterns for a frame's function name and/or
file name. Frames are scanned innermost first; at each frame the rules are tried in order, and
the first match names the owner. When nothing matches, the owner is
``unattributed:<function> (<file>)`` of the top frame: the innermost frame outside the skipped
files (torch internals, memest's own hooks, contextlib), so unattributed bytes stay visible.

User rules come from a JSON file::

    {"rules": [{"owner": "my_buffer", "function": "alloc_*", "file": "*/mypkg/*.py"}],
     "skip_files": ["*/mypkg/allocator_shim.py"]}
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fnmatch import translate
from pathlib import Path
from typing import Any

from memest.errors import ConfigError

UNATTRIBUTED = "unattributed"
NO_STACK = "<no stack>"
COMPILED_PIECE = "compiled_piece"
# Inductor's generated modules (<cache>/<2 chars>/c<hash>.py, entry point ``call``): under
# VLLM_COMPILE the model's own frames are gone, and the hash names nothing a reader can act on.
_INDUCTOR_FILE = re.compile(r"(^|/)[a-z0-9]{2}/c[a-z0-9]{40,}\.py$")


@dataclass(frozen=True, slots=True)
class OwnerRule:
    """One pattern → owner rule (glob patterns; an omitted pattern matches anything)."""

    owner: str
    function: str | None = None
    file: str | None = None


# vLLM 0.33.0 (shared hook map, section 4). Order matters within one frame only.
_VLLM_0_33_RULES: tuple[OwnerRule, ...] = (
    OwnerRule("indexer_logits_fp32", "as_fp32_logits"),
    OwnerRule("indexer_logits_bf16", "fp8_fp4_paged_mqa_logits"),
    OwnerRule("indexer_logits_bf16", "fp8_fp4_mqa_logits"),
    OwnerRule("indexer_logits_bf16", "_decode_rows", "*sparse*indexer*"),
    OwnerRule("indexer_logits_bf16", "_decode_rows", "*/specialized_decode/*"),
    OwnerRule("indexer_logits_bf16", "*", "*/sparse_indexer_scores.py"),
    OwnerRule("indexer_logits_bf16", "*", "*/qsa_indexer.py"),
    OwnerRule("aux_hidden_states", "_maybe_add_hidden_state"),
    OwnerRule("aux_hidden_states", "_store_hidden_states", "*spec_decode/*"),
    OwnerRule("aux_hidden_states", "store_capture_output"),
    OwnerRule("draft_logits", "compute_draft_logits"),
    OwnerRule("draft_logits", "_sample_sequential*", "*spec_decode/dspark/*"),
    OwnerRule("draft_logits", "sample_draft", "*spec_decode/*"),
    OwnerRule("attn_output", "_alloc_attn_out"),
    OwnerRule("qnorm_rope_kv_insert", "_fused_qnorm_rope_kv_insert"),
    OwnerRule("moe_workspace", "_allocate_buffers", "*fused_moe/*"),
    OwnerRule("moe_workspace", "*", "*/fused_moe/*"),
    OwnerRule("gemm_workspace", "*gemm*", "*vllm/*"),
    OwnerRule("gemm_workspace", "*", "*/layers/quantization/*"),
    OwnerRule("gemm_workspace", "*_get_*workspace_buffer", "*vllm/v1/attention/*"),
    OwnerRule("kv_cache", "allocate_kv_cache"),
    OwnerRule("kv_cache", "_allocate_kv_cache_tensors"),
    OwnerRule("kv_cache", "initialize_kv_cache_tensors"),
    OwnerRule("weights", "load_weights"),
    OwnerRule("weights", "*", "*/model_loader/*"),
    OwnerRule("weights", "process_weights_after_loading"),
)

_DEFAULT_SKIP_FILES: tuple[str, ...] = (
    "torch/*",
    "*/torch/*",
    "*memest_instrumentation/*",
    "*/contextlib.py",
    "contextlib.py",
    "*/threading.py",
    "*/functools.py",
    "<*",
)


def _compile(pattern: str | None) -> re.Pattern[str] | None:
    if pattern is None or pattern == "*":
        return None
    return re.compile(translate(pattern))


@dataclass
class OwnerRules:
    """An ordered list of owner rules plus the files skipped when naming the top frame."""

    rules: list[OwnerRule] = field(default_factory=list)
    skip_files: list[str] = field(default_factory=lambda: list(_DEFAULT_SKIP_FILES))
    _compiled: list[tuple[str, re.Pattern[str] | None, re.Pattern[str] | None]] = field(
        default_factory=list, init=False, repr=False
    )
    _skip: re.Pattern[str] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._recompile()

    def _recompile(self) -> None:
        self._compiled = [(r.owner, _compile(r.function), _compile(r.file)) for r in self.rules]
        self._skip = (
            re.compile("|".join(f"(?:{translate(p)})" for p in self.skip_files))
            if self.skip_files
            else None
        )

    @classmethod
    def default(cls) -> OwnerRules:
        """Rules for vLLM 0.33.0's owners (indexer logits, aux hidden states, draft logits, ...)."""
        return cls(rules=list(_VLLM_0_33_RULES))

    @classmethod
    def from_data(cls, data: object, *, source: str = "rules") -> OwnerRules:
        """Rules from a parsed JSON object (see the module docstring).

        Raises:
            ConfigError: a rule lacks an owner, has no pattern, or has a non-string pattern.
        """
        if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
            raise ConfigError(
                source,
                data if not isinstance(data, dict) else "...",
                'expected {"rules": [{"owner": ..., "function": ..., "file": ...}]}',
            )
        rules: list[OwnerRule] = []
        for i, item in enumerate(data["rules"]):
            where = f"{source}.rules[{i}]"
            if not isinstance(item, dict):
                raise ConfigError(where, item, "expected an object")
            unknown = set(item) - {"owner", "function", "file"}
            if unknown:
                raise ConfigError(where, sorted(unknown), "unknown keys (owner, function, file)")
            owner = item.get("owner")
            if not isinstance(owner, str) or not owner:
                raise ConfigError(f"{where}.owner", owner, "expected a non-empty string")
            func, file = item.get("function"), item.get("file")
            for name, value in (("function", func), ("file", file)):
                if value is not None and not isinstance(value, str):
                    raise ConfigError(f"{where}.{name}", value, "expected a glob string")
            if func is None and file is None:
                raise ConfigError(where, item, "a rule needs 'function' or 'file'")
            rules.append(OwnerRule(owner, func, file))
        skip = data.get("skip_files", [])
        if not isinstance(skip, list) or not all(isinstance(s, str) for s in skip):
            raise ConfigError(f"{source}.skip_files", skip, "expected a list of glob strings")
        return cls(rules=rules, skip_files=[*_DEFAULT_SKIP_FILES, *skip])

    @classmethod
    def from_file(cls, path: str | Path, *, with_defaults: bool = True) -> OwnerRules:
        """Rules from a JSON file; by default they take priority over the vLLM defaults.

        Raises:
            ConfigError: the file is not valid JSON or a rule is malformed.
        """
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(str(p), f"line {exc.lineno}", "invalid JSON") from None
        user = cls.from_data(data, source=str(p))
        return cls.default().extend(user) if with_defaults else user

    def extend(self, other: OwnerRules | Iterable[OwnerRule]) -> OwnerRules:
        """A new rule set: ``other``'s rules first (they win at the same frame), then these."""
        if isinstance(other, OwnerRules):
            rules, skip = list(other.rules), list(other.skip_files)
        else:
            rules, skip = list(other), []
        merged_skip = list(dict.fromkeys([*self.skip_files, *skip]))
        return OwnerRules(rules=[*rules, *self.rules], skip_files=merged_skip)

    def to_data(self) -> dict[str, Any]:
        return {
            "rules": [
                {
                    k: v
                    for k, v in (("owner", r.owner), ("function", r.function), ("file", r.file))
                    if v is not None
                }
                for r in self.rules
            ],
            "skip_files": list(self.skip_files),
        }

    def skipped(self, filename: str) -> bool:
        return bool(self._skip and self._skip.match(filename))

    def match_frame(self, frame: Sequence[Any]) -> str | None:
        """Owner named by one frame, or None."""
        filename, name = str(frame[0]), str(frame[2])
        for owner, fpat, filepat in self._compiled:
            if (fpat is None or fpat.match(name)) and (filepat is None or filepat.match(filename)):
                return owner
        return None

    def classify(self, frames: Sequence[Sequence[Any]]) -> tuple[str, str]:
        """Owner and top frame of a stack (frames ``[filename, line, name]``, innermost first)."""
        return self.classify_indexed(frames, range(len(frames)), {})

    def classify_indexed(
        self,
        frames: Sequence[Sequence[Any]],
        stack: Sequence[int],
        cache: dict[int, tuple[str | None, bool]],
    ) -> tuple[str, str]:
        """classify() for a stack of indices into ``frames``, memoising each frame's verdict."""
        top = None
        for idx in stack:
            verdict = cache.get(idx)
            if verdict is None:
                frame = frames[idx]
                verdict = (self.match_frame(frame), self.skipped(str(frame[0])))
                cache[idx] = verdict
            owner, skipped = verdict
            if owner is not None:
                return owner, _fmt_frame(frames[idx])
            if top is None and not skipped:
                top = frames[idx]
        if top is None:
            if not stack:
                return f"{UNATTRIBUTED}:{NO_STACK}", NO_STACK
            top = frames[stack[0]]
        if str(top[2]) == "call" and _INDUCTOR_FILE.search(str(top[0])):
            return COMPILED_PIECE, _fmt_frame(top)
        return f"{UNATTRIBUTED}:{top[2]} ({top[0]})", _fmt_frame(top)


def _fmt_frame(frame: Sequence[Any]) -> str:
    return f"{frame[2]} ({frame[0]}:{frame[1]})"
