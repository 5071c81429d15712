"""Pre-flight: the KV budget of a model never started on this GPU, from its config.json and grid.

Pure Python (no torch): a request resolved into the laws' Setup and the prediction (predict.py),
every term's law from memest.estimate.terms.catalog (shared with the what-if), the coefficients
fitted from measured starts where vLLM's code cannot give the number (calibration.py; data/ per
GPU kind and vLLM version, fitted by lab/fit.py).
"""

from memest.estimate.terms.coefficients import Coefficients
from memest.preflight.calibration import Calibration, load_calibration
from memest.preflight.predict import preflight, request_from

__all__ = ["Calibration", "Coefficients", "load_calibration", "preflight", "request_from"]
