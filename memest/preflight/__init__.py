"""Pre-flight: the KV budget of a model never started on this GPU, from its config.json and grid.

Pure Python (no torch): model shapes (shape.py), a synthetic graph-pool trace replayed through the
allocator model (memest.estimate.synthetic_trace, shared with the what-if), laws whose coefficients were fitted from measured starts
(calibration.py; data/ per GPU kind and vLLM version, fitted by lab/fit.py) and the
prediction (predict.py).
"""

from memest.preflight.calibration import Calibration, Coefficients, load_calibration
from memest.preflight.predict import preflight, request_from

__all__ = ["Calibration", "Coefficients", "load_calibration", "preflight", "request_from"]
