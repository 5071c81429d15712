"""The coefficients the term laws read where vLLM's code cannot give the number.

Each is fitted from measured starts per GPU kind and vLLM version (lab/fit.py; shipped as
memest/preflight/data/<gpu>-vllm-<version>.json, memest.preflight.calibration). What vLLM's code
sizes (its grid-sized buffers, the sampler's reserve, the fused-MoE workspace, MLA's context
chunk, the graph pools, TP's communicators) is derived, never fitted: these hold what is left,
the CUDA context and library handles (cuBLAS workspaces, graph objects), and the factors of the
forward's activations and the profiling residue, which no allocator replay of vLLM's forward
sizes yet.
"""

from __future__ import annotations

from pydantic import Field

from memest.schema._base import MemestModel


class Coefficients(MemestModel):
    """The laws' coefficients (see memest.preflight.predict for the laws).

    The grid-sized runner buffers of vLLM 0.33.0 (memest.estimate.runner_buffers) are not fitted:
    they are computed from the grid and the model and added to the term of the phase that
    allocates them; the coefficients fit what each term holds beyond them.
    """

    baseline_bytes: int = Field(
        description="Allocator reservation before the weights beyond the grid-sized buffers: "
        "the cuBLAS workspaces of device init (library handles: no vLLM code sizes them)"
    )
    baseline_drafter_bytes: int = Field(description="Added with a drafter, beyond its buffers")
    weights_rest_bytes: int = Field(
        description="Weights phase beyond the parameters and the grid-sized buffers"
    )
    activation_factor: float = Field(
        description="The forward's activation headroom over max_num_batched_tokens x one "
        "layer's token bytes (not yet an allocator replay of vLLM's forward; the sampler's "
        "reserve beside it is derived)"
    )
    activation_drafter_factor: float = Field(
        description="The drafter's share, over max_num_batched_tokens x its layer's token bytes"
    )
    outside_bytes: int = Field(
        description="Memory outside PyTorch with no graphs: the CUDA context and library "
        "handles (no vLLM code sizes them)"
    )
    outside_per_graph_layer_bytes: float = Field(
        description="Outside PyTorch per captured graph and decoder layer: the CUDA graph "
        "objects the driver holds (no vLLM code sizes them)"
    )
    residue_bytes: int = Field(description="Profiling residue beyond the sampler's buffer")
    residue_factor: float = Field(
        description="Profiling residue beyond the sampler's buffer, over max_num_batched_tokens "
        "x hidden x dtype bytes"
    )
    residue_drafter_bytes: int = Field(description="Profiling residue a drafter adds")
    runner_rest_bytes: int = Field(
        description="Runner buffers (KV allocation phase) beyond the block tables, no drafter"
    )
    runner_rest_drafter_bytes: int = Field(description="The same with a drafter")
