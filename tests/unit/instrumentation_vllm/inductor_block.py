"""A small Llama-like model compiled by Inductor on CPU the way vLLM does (standalone_compile).

Run as a script: ``python inductor_block.py cold|warm OUT.json``. The environment names
TORCHINDUCTOR_CACHE_DIR and MEMEST_CODE_MAP_DIR. ``cold`` records each graph around its compile
(memest_instrumentation.vllm.inductor.record_graph); ``warm`` strips ``nn_module_stack`` from the
graph first, as vLLM does to the graphs it caches, so the map must come from the kept node maps.
The script writes the end-of-init map (``collect()``) and the generated modules' paths.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

TOKENS, HIDDEN, HEADS, FFN, VOCAB = 8, 64, 4, 80, 112


class RMSNorm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + 1e-6)).to(x.dtype) * self.weight


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv_proj = nn.Linear(HIDDEN, 3 * HIDDEN, bias=False)
        self.o_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.q_norm = RMSNorm(HIDDEN // HEADS)
        self.k_norm = RMSNorm(HIDDEN // HEADS)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split(HIDDEN, -1)
        q = self.q_norm(q.view(t, HEADS, -1))
        k = self.k_norm(k.view(t, HEADS, -1))
        q = q * cos + torch.roll(q, 1, -1) * sin
        k = k * cos + torch.roll(k, 1, -1) * sin
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.view(t, HEADS, -1).transpose(0, 1)
        )
        return self.o_proj(o.transpose(0, 1).reshape(t, HIDDEN))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(HIDDEN, 2 * FFN, bias=False)
        self.down_proj = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, -1)
        return self.down_proj(F.silu(gate) * up)


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(HIDDEN)
        self.self_attn = Attention()
        self.post_attention_layernorm = RMSNorm(HIDDEN)
        self.mlp = MLP()

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList([Layer()])
        self.norm = RMSNorm(HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def main(mode: str, out: str) -> None:
    from memest_instrumentation.vllm import inductor
    from memest_instrumentation.vllm.state import state
    from torch._inductor import standalone_compile

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        if mode == "warm":
            for node in gm.graph.nodes:
                node.meta.pop("nn_module_stack", None)
        return inductor.record_graph(
            gm,
            lambda: standalone_compile(
                gm, example_inputs, dynamic_shapes="from_example_inputs", options={}
            ),
        )

    torch.manual_seed(0)
    model = Model()
    ids = torch.randint(0, VOCAB, (TOKENS,))
    cos, sin = torch.randn(TOKENS, 1, HIDDEN // HEADS), torch.randn(TOKENS, 1, HIDDEN // HEADS)
    with torch.no_grad():
        torch.compile(model, backend=backend, fullgraph=True)(ids, cos, sin)
    code = inductor.collect()
    result = {
        "compiled_code": code.model_dump(mode="json") if code else None,
        "paths": inductor.loaded_modules(),
        "hook_errors": state().hook_errors,
    }
    with open(out, "w") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
