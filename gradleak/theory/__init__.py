"""Liu et al. §3 theory for two-layer networks: defended gradients as functions of the data, the
Cramér–Rao lower bound (Eqs. 27–28), Table 1's scalings, Prop. 2.1, and the bound study."""
from .bounds import BoundReport, DPRequirement, dp_noise_requirement, frobenius_sq, jacobian, lower_bound
from .defenses import DefendedGradient, TheoryDefense, TwoLayerView, covered_defenses, defended_gradient, parse_defense
from .model import TwoLayerNet, gradient, gradient_at, random_data, random_network, split_gradient

__all__ = ["BoundReport", "DPRequirement", "dp_noise_requirement", "frobenius_sq", "jacobian", "lower_bound",
           "covered_defenses", "DefendedGradient", "TheoryDefense", "TwoLayerView", "defended_gradient",
           "parse_defense",
           "TwoLayerNet", "gradient", "gradient_at", "random_data", "random_network", "split_gradient"]
