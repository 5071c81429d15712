"""Recorder: phase readings, stage tags and allocator history for any PyTorch program.

Usage::

    from memest_instrumentation.torch import Recorder

    rec = Recorder(history=True, max_entries=1_000_000, stacks="python", scrub_paths=True)
    rec.start()
    with rec.phase("weights"):
        load()
    with rec.phase("capture"), rec.stage("target.full"):
        capture()
    snap = rec.snapshot()          # memest JSON form, for memest.analysis.analyze
    rec.stop()

The recorder never raises into the host program: without CUDA, without NVML or on a torch
without per-event metadata it degrades and records one line in ``rec.warnings``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from memest.schema.breakdown import MemoryReading, PhaseRecord
from memest.snapshot.convert import from_torch, scrub_roots_default
from memest.snapshot.format import Snapshot, empty_snapshot
from memest_instrumentation.torch import _compat, graphs, tagging
from memest_instrumentation.torch.tagging import StageTag


class _Nvml:
    """Device memory in use through nvidia-ml-py, matched to the CUDA device by PCI bus id."""

    def __init__(self) -> None:
        self.handle: Any = None
        self.mod: Any = None

    def open(self, device: int) -> None:
        import pynvml

        pynvml.nvmlInit()
        bus = _compat.pci_bus_id(device)
        self.handle = (
            pynvml.nvmlDeviceGetHandleByPciBusId(bus)
            if bus is not None
            else pynvml.nvmlDeviceGetHandleByIndex(device)
        )
        self.mod = pynvml

    def used_total(self) -> tuple[int, int]:
        info = self.mod.nvmlDeviceGetMemoryInfo(self.handle)
        return int(info.used), int(info.total)


class Recorder:
    """Phase readings, stage tags and memory history (see the module docstring).

    Args:
        history: record allocator history (every alloc / free / segment event with stacks).
        max_entries: ring-buffer size of the history; older events are overwritten beyond it.
        stacks: "python" (default, cheap) or "all" (adds C++ frames; slow to dump).
        scrub_paths: replace local paths in frames by module-relative ones in snapshot().
        device: CUDA device index; default the current device when first needed.
        pool_readings: read reserved bytes per pool at phase edges (an allocator snapshot
            without traces; cheap on torch that supports include_traces=False).
        context: "alloc" (default) records stacks on allocations and segment events; "all"
            also on frees (about twice the recording cost; the analysis does not use them).
    """

    def __init__(
        self,
        history: bool = True,
        max_entries: int = 1_000_000,
        stacks: Literal["python", "all"] = "python",
        scrub_paths: bool = True,
        device: int | None = None,
        pool_readings: bool = True,
        context: Literal["alloc", "all"] = "alloc",
    ) -> None:
        self.history = history
        self.context = context
        self.max_entries = max_entries
        self.stacks = stacks
        self.scrub_paths = scrub_paths
        self.device = device
        self.pool_readings = pool_readings
        self.phases: list[PhaseRecord] = []
        self.warnings: list[str] = []
        self._warned: set[str] = set()
        self._nvml: _Nvml | None = None
        self._nvml_failed = False
        self._started = False
        self._history_on = False
        self._graphs_on = False
        self._metadata = False
        self._window_mark = tagging.window_mark()

    # -- degradation ----------------------------------------------------------------------
    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self.warnings.append(message)

    def _cuda_ready(self) -> bool:
        try:
            return _compat.cuda_available() and _compat.cuda_initialized()
        except Exception as exc:  # fail open: no torch, broken CUDA
            self._warn("torch", f"torch unavailable ({type(exc).__name__}: {exc})")
            return False

    def _dev(self) -> int:
        if self.device is None:
            self.device = _compat.current_device()
        return self.device

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Recorder:
        """Start memory history (if requested and possible) and the graph-pool hooks."""
        if self._started:
            return self
        self._started = True
        self._window_mark = tagging.window_mark()
        try:
            available = _compat.cuda_available()
        except Exception as exc:  # fail open: torch missing or broken
            self._warn("torch", f"torch unavailable ({type(exc).__name__}: {exc})")
            return self
        if not available:
            self._warn("cuda", "CUDA not available: no allocator history, readings are empty")
            return self
        try:
            self._graphs_on = graphs.install()
            if not self._graphs_on:
                self._warn("graphs", "torch.cuda.CUDAGraph has no capture_begin: no pool tags")
        except Exception as exc:  # fail open
            self._warn("graphs", f"graph-pool hooks not installed: {exc}")
        if self.history:
            try:
                _compat.start_history(
                    max_entries=self.max_entries, stacks=self.stacks, context=self.context
                )
                self._history_on = True
            except Exception as exc:  # fail open
                self._warn("history", f"memory history not started: {exc}")
        try:
            self._metadata = _compat.metadata_supported()
        except Exception:  # fail open
            self._metadata = False
        if self._metadata:
            tagging.set_apply(True)
        else:
            self._warn(
                "metadata",
                f"torch {_compat.torch_version_text()} cannot tag allocator events: stages "
                "are split by time windows instead",
            )
        return self

    def stop(self) -> None:
        """Stop history (if this recorder started it) and remove the graph-pool hooks."""
        if not self._started:
            return
        self._started = False
        if self._metadata:
            tagging.set_apply(False)
            try:
                _compat.set_metadata("")
            except Exception:  # fail open
                pass
        if self._history_on:
            try:
                _compat.stop_history()
            except Exception as exc:  # fail open
                self._warn("history-stop", f"memory history not stopped: {exc}")
            self._history_on = False
        if self._graphs_on:
            try:
                graphs.uninstall()
            except Exception:  # fail open
                pass
            self._graphs_on = False

    def __enter__(self) -> Recorder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- readings ----------------------------------------------------------------------------
    def reading(self) -> MemoryReading:
        """Device and allocator state now (empty fields where unavailable; never raises)."""
        values: dict[str, Any] = {"time_ns": time.monotonic_ns()}
        try:
            if not self._cuda_ready():
                return MemoryReading(**values)
            dev = self._dev()
            self._device_reading(dev, values)
            reserved, allocated, reserved_peak, allocated_peak = _compat.allocator_stats(dev)
            values.update(
                torch_reserved_bytes=reserved,
                torch_allocated_bytes=allocated,
                torch_reserved_peak_bytes=reserved_peak,
                torch_allocated_peak_bytes=allocated_peak,
            )
            if self.pool_readings:
                try:
                    values["pool_reserved_bytes"] = _compat.pool_reserved(dev)
                except Exception as exc:  # fail open
                    self._warn("pools", f"per-pool reserved bytes unavailable: {exc}")
            return MemoryReading(**values)
        except Exception as exc:  # fail open: a reading must never break the host
            self._warn("reading", f"reading failed: {type(exc).__name__}: {exc}")
            return MemoryReading(time_ns=values["time_ns"])

    def _device_reading(self, dev: int, values: dict[str, Any]) -> None:
        if self._nvml is None and not self._nvml_failed:
            try:
                nvml = _Nvml()
                nvml.open(dev)
                self._nvml = nvml
            except Exception as exc:  # fall back to cudaMemGetInfo
                self._nvml_failed = True
                self._warn("nvml", f"NVML unavailable ({exc}); device memory from cudaMemGetInfo")
        if self._nvml is not None:
            try:
                used, total = self._nvml.used_total()
                values.update(
                    device_used_bytes=used, device_total_bytes=total, device_source="nvml"
                )
                return
            except Exception as exc:  # fall back to cudaMemGetInfo
                self._warn("nvml-read", f"NVML read failed ({exc}); using cudaMemGetInfo")
        free, total = _compat.mem_get_info(dev)
        values.update(
            device_used_bytes=total - free, device_total_bytes=total, device_source="cudaMemGetInfo"
        )

    # -- windows -----------------------------------------------------------------------------
    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A startup phase: readings at both edges, and ``phase=name`` in the tag."""
        start = self.reading()
        token = self._push(tagging.current_tag().with_(phase=name), "phase")
        try:
            yield
        finally:
            self._pop(token)
            try:
                self.phases.append(PhaseRecord(name=name, start=start, end=self.reading()))
            except Exception as exc:  # fail open
                self._warn("phase", f"phase {name} not recorded: {exc}")

    @contextmanager
    def stage(self, name: str | None = None, *, capture_size: int | None = None) -> Iterator[None]:
        """A capture stage (or, with only ``capture_size``, one size inside the current stage).

        Every allocator event inside carries the stage; nests, and restores the previous tag on
        exit or exception.
        """
        cur = tagging.current_tag()
        if name is not None:
            tag = StageTag(phase=cur.phase, stage=name, capture_size=capture_size, pool=cur.pool)
        else:
            tag = cur.with_(capture_size=capture_size)
        token = self._push(tag, "stage")
        try:
            yield
        finally:
            self._pop(token)

    def _push(self, tag: StageTag, kind: str) -> int | None:
        try:
            return tagging.push_tag(tag, kind)
        except Exception as exc:  # fail open
            self._warn("tag", f"tagging failed: {exc}")
            return None

    def _pop(self, token: int | None) -> None:
        if token is None:
            return
        try:
            tagging.pop_tag(token)
        except Exception as exc:  # fail open
            self._warn("tag", f"tagging failed: {exc}")

    # -- snapshot ----------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """The allocator history as memest JSON (with windows, phases and warnings)."""
        snap: Snapshot | None = None
        if self._cuda_ready() and self._history_on:
            try:
                raw = _compat.raw_snapshot()
                snap = from_torch(
                    raw,
                    device=self._dev(),
                    scrub_paths=self.scrub_paths,
                    roots=scrub_roots_default() if self.scrub_paths else (),
                    extra_source={
                        "torch_version": _compat.torch_version_text(),
                        "max_entries": self.max_entries,
                        "stacks": self.stacks,
                        "metadata": self._metadata,
                    },
                )
            except Exception as exc:  # fail open
                self._warn("snapshot", f"snapshot failed: {type(exc).__name__}: {exc}")
        for message in graphs.errors:
            self._warn(message, message)
        if snap is None:
            snap = empty_snapshot()
        snap["windows"] = tagging.windows_since(self._window_mark)
        snap["phases"] = [p.model_dump(mode="json") for p in self.phases]
        snap["recorder_warnings"] = list(self.warnings)
        return snap
