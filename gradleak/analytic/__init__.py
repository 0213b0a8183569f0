"""Closed-form / spectral building blocks for the analytic attacks (tensor method, ICA)."""
from .tensor_method import (
                            TensorResult,
                            hermite_expectations,
                            tensor_decompose,
                            tensor_features,
                            tensor_features_from_first_layer,
)

__all__ = ["TensorResult", "hermite_expectations", "tensor_decompose", "tensor_features",
           "tensor_features_from_first_layer"]
