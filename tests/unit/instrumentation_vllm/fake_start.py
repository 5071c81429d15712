"""A vLLM-0.33.0-shaped start driven through memest's real wrappers on stand-in objects.

The wrappers are the ones the plugin installs (``hooks.PATCHES``), applied to stand-in functions
that do what vLLM's methods do to the call order: the worker calls the runner, graph-memory
profiling initialises a small KV cache and captures through a CudaGraphManager, the real KV cache
is allocated, then the real capture runs. No GPU is needed; readings are empty on CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from memest_instrumentation.vllm.hooks import PATCHES
from memest_instrumentation.vllm.patches import Patch

PAGE_ALL = 8 << 20  # KV bytes per block, all 4 layers
RETURNS: dict[str, Any] = {
    "determine_available_memory": 123 << 20,
    "profile_cudagraph_memory": 7 << 20,
    "capture_model": 5 << 20,
    "compile_or_warm_up_model": "compile-times",
}


def wrapper_for(name: str, runner: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    patch: Patch = next(p for p in PATCHES if p.name == name and p.runner in (runner, "both"))
    return patch.make(orig)


class Desc:
    def __init__(self, mode: str, n: int, uniform: int | None = None) -> None:
        self.cg_mode = SimpleNamespace(name=mode)
        self.num_tokens = n
        self.uniform_token_count = uniform
        self.max_query_len = uniform


class FakeManager:
    def __init__(self) -> None:
        self.pool: tuple[int, ...] = (0, 1)
        self._max_full_descs_to_capture: int | None = None
        self.descs = [Desc("PIECEWISE", 8), Desc("PIECEWISE", 4), Desc("FULL", 4, 1)]

    def capture(self, create_forward_fn: Callable[..., Any], progress_bar_desc: str = "") -> None:
        for d in self.descs:
            fwd = create_forward_fn(d, True)
            fwd()


class FakeDevice:
    """Device memory a start spends, in vLLM's order, with known sizes (bytes).

    ``measure`` functions of the plugin are pointed at it (``install``), so the plugin's
    readings see exactly these numbers. Outside-PyTorch memory that the profiling graphs hold
    (``graph_objects``) goes away at teardown; lazily loaded kernels (``lazy``) stay.
    """

    MiB = 1 << 20

    def __init__(self) -> None:
        m = self.MiB
        self.total = 140 * 1024 * m
        self.outside = 0
        self.pools: dict[str, list[int]] = {"0,0": [0, 0]}  # reserved, allocated
        self.peak = 0
        self.sizes = {
            "context": 800 * m,
            "weights": 15_000 * m,
            "activation": 400 * m,
            "profile_residue": 30 * m,
            "runner": 4 * m,
            "pool": 62 * m,
            "outputs": 48 * m,
            "graph_objects": 20 * m,
            "lazy": 160 * m,
        }
        self.profiling_kv = 250 * m
        self.private = "0,2"

    def alloc(self, pool: str, n: int) -> None:
        r = self.pools.setdefault(pool, [0, 0])
        r[0] += n
        r[1] += n
        self.peak = max(
            self.peak, self.pools["0,0"][1] + sum(v[1] for k, v in self.pools.items() if k != "0,0")
        )

    def free(self, pool: str, n: int) -> None:
        self.pools[pool][0] -= n
        self.pools[pool][1] -= n

    @property
    def allocated(self) -> int:
        return sum(v[1] for v in self.pools.values())

    @property
    def reserved(self) -> int:
        return sum(v[0] for v in self.pools.values())

    def reading(self, *, pools: bool = True, sync: bool = True) -> Any:
        from memest.schema import MemoryReading

        return MemoryReading(
            time_ns=0,
            device_used_bytes=self.outside + self.reserved,
            device_total_bytes=self.total,
            device_source="cudaMemGetInfo",
            torch_reserved_bytes=self.reserved,
            torch_allocated_bytes=self.allocated,
            torch_reserved_peak_bytes=self.reserved,
            torch_allocated_peak_bytes=self.peak,
            pool_reserved_bytes={k: v[0] for k, v in self.pools.items() if v[0] or k == "0,0"},
        )

    def reset_peak(self) -> None:
        self.peak = self.allocated

    def install(self, monkeypatch: Any) -> None:
        from memest_instrumentation.vllm import hooks, measure

        monkeypatch.setattr(measure, "reading", self.reading)
        monkeypatch.setattr(measure, "settle", lambda **_: None)
        monkeypatch.setattr(measure, "reset_peak", self.reset_peak)
        monkeypatch.setattr(measure, "cuda_ready", lambda: True)
        monkeypatch.setattr(measure, "gpu_properties", lambda: ("Fake H200", self.total, "9.0"))
        monkeypatch.setattr(
            measure, "pool_usage", lambda: {k: (v[0], v[1]) for k, v in self.pools.items()}
        )
        monkeypatch.setattr(hooks, "_global_pool_key", lambda: self.private)

    def used(self) -> int:
        return self.outside + self.reserved


def build_start(dev: FakeDevice | None = None) -> tuple[Any, dict[str, Callable[..., Any]]]:
    """(worker, calls): the worker and the wrapped methods in vLLM's order.

    With ``dev``, every stand-in spends device memory on it as vLLM would.
    """
    calls: list[str] = []
    z = dev.sizes if dev is not None else {}
    mgr = FakeManager()
    cg_capture = wrapper_for("capture_stage", "v2", FakeManager.capture)

    def forward_factory(desc: Any, warmup: bool) -> Callable[[], str]:
        calls.append(f"fwd:{desc.cg_mode.name}:{desc.num_tokens}")
        return lambda: "ran"

    def capture_model(self: Any, *, profile_only: bool = False) -> int:
        calls.append(f"capture_model:{profile_only}")
        if dev is not None:
            mgr.pool = tuple(int(x) for x in dev.private.split(","))

            def spend(desc: Any, warmup: bool) -> Callable[[], str]:
                fwd = forward_factory(desc, warmup)
                if desc.cg_mode.name == "PIECEWISE" and desc.num_tokens == 8:
                    dev.alloc(dev.private, z["pool"])  # widest piecewise graph grows the pool
                return fwd

            dev.alloc("0,0", z["outputs"])
            dev.outside += z["graph_objects"]
            if profile_only:
                dev.outside += z["lazy"]
            cg_capture(mgr, spend, "Capturing CUDA graphs")
            return int(RETURNS["capture_model"])
        cg_capture(mgr, forward_factory, "Capturing CUDA graphs")
        cg_capture(mgr, forward_factory, "Capturing prefill CUDA graphs")
        return int(RETURNS["capture_model"])

    def initialize_kv_cache(self: Any, kv_cache_config: Any, is_profiling: bool = False) -> None:
        calls.append(f"initialize_kv_cache:{is_profiling}")
        if dev is not None:
            dev.alloc("0,0", z["runner"])
            kv = dev.profiling_kv if is_profiling else kv_cache_config.num_blocks * PAGE_ALL
            dev.alloc("0,0", kv)
            alloc_kv(SimpleNamespace(kv_cache_tensors=[SimpleNamespace(size=kv)]), None)

    alloc_kv = wrapper_for("allocate_kv_cache", "v2", lambda cfg, device: {})
    runner = SimpleNamespace(model_memory_usage=z.get("weights", 16 << 30))
    runner.capture_model = wrapper_for("capture", "v2", capture_model).__get__(runner)
    runner.initialize_kv_cache = wrapper_for("kv_cache_alloc", "v2", initialize_kv_cache).__get__(
        runner
    )

    def profile_run(self: Any, randomize_inputs: bool = False) -> None:
        calls.append("profile_run")
        if dev is not None:
            if calls.count("profile_run") == 1:  # what a first pass leaves (lazy buffers)
                dev.alloc("0,0", z["profile_residue"])
                if z.get("compile"):  # torch.compile's transients in a first start's pass
                    dev.alloc("0,0", z["compile"])
                    dev.free("0,0", z["compile"])
            dev.alloc("0,0", z["activation"])
            dev.free("0,0", z["activation"])

    def profile_cudagraph_memory(self: Any) -> int:
        self.initialize_kv_cache(SimpleNamespace(kv_cache_tensors=[]), is_profiling=True)
        self.capture_model(profile_only=True)
        if dev is not None:  # teardown: everything but lazily loaded kernels goes
            dev.free("0,0", dev.profiling_kv + z["runner"] + z["outputs"])
            dev.pools.pop(dev.private)
            dev.outside -= z["graph_objects"]
            dev.private = "0,1"
        return int(RETURNS["profile_cudagraph_memory"])

    runner.profile_run = wrapper_for("profile_run", "v2", profile_run).__get__(runner)
    runner.profile_cudagraph_memory = wrapper_for(
        "graph_profiling", "v2", profile_cudagraph_memory
    ).__get__(runner)

    vllm_config = SimpleNamespace(
        compilation_config=SimpleNamespace(
            cudagraph_capture_sizes=[4, 8],
            max_cudagraph_capture_size=8,
            cudagraph_mode=SimpleNamespace(name="FULL_AND_PIECEWISE"),
            mode=3,
        ),
        scheduler_config=SimpleNamespace(max_num_seqs=4, max_num_batched_tokens=64),
        speculative_config=None,
        model_config=SimpleNamespace(served_model_name="fake-llama", max_model_len=128),
        cache_config=None,
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
    )
    block = SimpleNamespace(
        page_size_bytes=PAGE_ALL // 4, block_size=16, num_kv_heads=8, head_size=128
    )
    worker = SimpleNamespace(
        rank=0,
        parallel_config=SimpleNamespace(world_size=1, tensor_parallel_size=1),
        init_snapshot=SimpleNamespace(free_memory=100 << 30, total_memory=141 << 30),
        requested_memory=int((140 << 30) * 0.85),
        model_runner=runner,
        vllm_config=vllm_config,
        use_v2_model_runner=True,
        cache_config=SimpleNamespace(
            kv_cache_memory_bytes=None, gpu_memory_utilization=0.85, num_gpu_blocks=None
        ),
        get_kv_cache_spec=lambda: {f"layer.{i}": block for i in range(4)},
        total_consumed=20 << 30,
        peak_activation_memory=1 << 30,
        cudagraph_memory_estimate=RETURNS["profile_cudagraph_memory"],
        available_kv_cache_memory_bytes=RETURNS["determine_available_memory"],
    )

    def init_device(self: Any) -> None:
        calls.append("init_device")
        if dev is not None:
            dev.outside += z["context"]

    def load_model(self: Any) -> None:
        calls.append("load_model")
        if dev is not None:
            dev.alloc("0,0", z["weights"])

    def determine_available_memory(self: Any) -> int:
        self.model_runner.profile_run()
        self.model_runner.profile_cudagraph_memory()
        return int(RETURNS["determine_available_memory"])

    def initialize_from_config(self: Any, kv_cache_config: Any) -> None:
        self.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
        self.model_runner.initialize_kv_cache(kv_cache_config)

    def compile_or_warm_up_model(self: Any) -> str:
        self.model_runner.capture_model()
        return str(RETURNS["compile_or_warm_up_model"])

    methods = {
        "init_device": wrapper_for("init_device", "both", init_device).__get__(worker),
        "load_model": wrapper_for("weights", "both", load_model).__get__(worker),
        "determine_available_memory": wrapper_for(
            "determine_available_memory", "both", determine_available_memory
        ).__get__(worker),
        "initialize_from_config": wrapper_for("kv_config", "both", initialize_from_config).__get__(
            worker
        ),
        "compile_or_warm_up_model": wrapper_for(
            "end_of_init", "both", compile_or_warm_up_model
        ).__get__(worker),
    }
    vllm_config.cache_config = worker.cache_config
    worker.calls = calls
    return worker, methods


def run_start(worker: Any, methods: dict[str, Callable[..., Any]]) -> dict[str, Any]:
    """Drive one start in vLLM's order; returns each worker method's return value."""
    out: dict[str, Any] = {}
    out["init_device"] = methods["init_device"]()
    out["load_model"] = methods["load_model"]()
    out["determine_available_memory"] = methods["determine_available_memory"]()
    out["initialize_from_config"] = methods["initialize_from_config"](
        SimpleNamespace(num_blocks=1000, kv_cache_tensors=[])
    )
    out["compile_or_warm_up_model"] = methods["compile_or_warm_up_model"]()
    return out


def sized_start(monkeypatch: Any, mode: str, **sizes: int) -> tuple[FakeDevice, Any, int]:
    """A MEMEST_ENABLE=1 start in ``mode`` on a FakeDevice (``sizes`` override its terms) whose
    KV cache takes what determine_available_memory returned; (device, worker, that budget)."""
    from memest_instrumentation.vllm import collect
    from memest_instrumentation.vllm.state import reset_state

    monkeypatch.setattr(collect, "compute_fingerprint", lambda worker: "0123456789abcdef")
    monkeypatch.setenv("MEMEST_ENABLE", "1")
    monkeypatch.setenv("MEMEST_ESTIMATE", mode)
    monkeypatch.setenv("MEMEST_RUN_ID", f"sized-{mode}")
    reset_state()
    dev = FakeDevice()
    dev.install(monkeypatch)
    dev.sizes.update(sizes)
    worker, methods = build_start(dev)
    methods["init_device"]()
    methods["load_model"]()
    budget = methods["determine_available_memory"]()
    blocks = budget // PAGE_ALL
    methods["initialize_from_config"](SimpleNamespace(num_blocks=blocks, kv_cache_tensors=[]))
    methods["compile_or_warm_up_model"]()
    return dev, worker, budget
