"""Closed-form and spectral solvers the analytic attacks call (fully-connected inversion, feature
inversion, ICA unmixing, the tensor method). Named `solvers`, not `analytic`, so it is not
taken for the analytic attacks themselves (gradleak.attacks)."""
from .tensor_method import (
                            TensorResult,
                            hermite_expectations,
                            tensor_decompose,
                            tensor_features,
                            tensor_features_from_first_layer,
)

__all__ = ["TensorResult", "hermite_expectations", "tensor_decompose", "tensor_features",
           "tensor_features_from_first_layer"]
