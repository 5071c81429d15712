"""PyTorch allocator and graph-pool hooks for any PyTorch program (not only vLLM).

Usage::

    from memest_instrumentation.torch import Recorder
    rec = Recorder().start()
    with rec.phase("capture"), rec.stage("target.full"):
        ...
    snapshot = rec.snapshot()

Tag helpers for other instrumentation (the vLLM plugin): ``current_tag``, ``format_tag``,
``parse_tag``, ``StageTag``. Importing this package does not import torch.
"""

from memest.snapshot.tags import StageTag, format_tag, parse_tag
from memest_instrumentation.torch.recorder import Recorder
from memest_instrumentation.torch.tagging import current_tag

__all__ = ["Recorder", "StageTag", "current_tag", "format_tag", "parse_tag"]
