"""Liu et al. §3 theory: numeric lower bound vs a hand-derived case, bounds vs the measured tensor
attack, fitted slopes, Remark E.4's pruning jump, the defenses as maps of the data, and the CLI."""
from __future__ import annotations

import json
import math

import pytest
import torch

from gradleak.cli import main
from gradleak.defenses import make_defense
from gradleak.errors import GradleakError
from gradleak.theory import (
    TwoLayerNet,
    defended_gradient,
    dp_noise_requirement,
    gradient,
    jacobian,
    lower_bound,
    random_data,
    random_network,
)
from gradleak.theory.defenses import parse_defense
from gradleak.theory.study import run_study

SLOPE_TOL = 0.15


def test_lower_bound_matches_hand_derived_linear_case():
    # σ(z) = z, f(x) = aᵀWx = vᵀx with v = Wᵀa, r = vᵀx − y. By hand:
    #   ∂(∇_{a_j}L)/∂x = (w_j·x) v + r w_j,   ∂(∇_{w_j}L)_k/∂x_l = a_j (x_k v_l + r δ_kl).
    a = torch.tensor([0.5, 0.25], dtype=torch.float64)
    W = torch.tensor([[1.0, 0.0], [1.0, 2.0]], dtype=torch.float64)
    x = torch.tensor([[0.6, 0.8]], dtype=torch.float64)
    y = torch.tensor([-1.0], dtype=torch.float64)
    net = TwoLayerNet(a=a, W=W, activation="linear")
    v = W.T @ a  # (0.75, 0.5)
    r = float(v @ x[0] - y[0])  # 0.85 + 1 = 1.85
    cols = [float(W[j] @ x[0]) * v + r * W[j] for j in range(2)]
    for j in range(2):
        for k in range(2):
            cols.append(a[j] * (x[0, k] * v + r * torch.eye(2, dtype=torch.float64)[k]))
    J_hand = torch.stack(cols, 1)  # (B·d, P) = (2, 6)
    assert torch.allclose(gradient(net, x, y)[:2], r * (W @ x[0]))
    assert torch.allclose(jacobian(defended_gradient(net, x, y).observe, x), J_hand, atol=1e-12)

    sigma = 0.3
    report = lower_bound(net, x, y, sigma)
    frob = float(J_hand.pow(2).sum())
    assert report.frobenius_sq == pytest.approx(frob, rel=1e-10)
    assert report.lower_numeric == pytest.approx(math.sqrt(sigma ** 2 * 1 * 2 ** 2 / frob), rel=1e-10)
    crlb = math.sqrt(sigma ** 2 * float(torch.trace(torch.linalg.inv(J_hand @ J_hand.T))))
    assert report.lower_crlb == pytest.approx(crlb, rel=1e-8)
    assert report.lower_crlb >= report.lower_numeric  # Lemma D.2: Tr(A⁻¹) ≥ n²/Tr(A)
    assert report.lower_closed_form == pytest.approx(sigma * math.sqrt(2 / 2))


def test_defended_gradients_behave_as_defined():
    net = random_network(6, 300, "tanh", seed=1)
    x, y = random_data(6, 4, seed=1)
    plain = defended_gradient(net, x, y, "none").observe(x)
    assert torch.allclose(defended_gradient(net, x, y, "secagg:clients=3").observe(x), plain, atol=1e-12)
    clip = defended_gradient(net, x, y, "clip:bound=0.5")
    assert float(clip.observe(x).norm()) == pytest.approx(0.5)
    assert clip.extra["clip_factor"] == pytest.approx(float(plain.norm()) / 0.5)
    local = defended_gradient(net, x, y, "local:steps=2,lr=1e-9").observe(x)
    assert torch.allclose(local, 2 * plain, rtol=1e-4, atol=1e-9)
    drop = defended_gradient(net, x, y, "dropout:p=0.5,place=model")
    assert drop.observe(x).numel() == len(drop.neurons) * 7 and 100 < len(drop.neurons) < 200
    prune = defended_gradient(net, x, y, "prune:ratio=0.5,scope=global")
    assert prune.observe(x).numel() == plain.numel() // 2
    assert len(prune.neurons) >= 290  # W-gradients (a_j = 1/m smaller) go first: ~every ∇_a survives

    base = lower_bound(net, x, y, 0.1)
    noisy = lower_bound(net, x, y, 0.1, "noise:sigma=0.3")
    assert noisy.lower_numeric == pytest.approx(base.lower_numeric * math.sqrt(0.1 ** 2 + 0.3 ** 2) / 0.1)
    dropped = lower_bound(net, x, y, 0.1, "dropout:p=0.5,place=model")
    assert dropped.lower_numeric > base.lower_numeric * 1.2  # ||J_keep||² ≈ (1−p)||J||²
    clipped = lower_bound(net, x, y, 0.1, "clip:bound=0.05")
    assert clipped.lower_numeric > base.lower_numeric * 0.8 * clipped.clip_factor


def test_theory_speaks_the_defense_vocabulary():
    net = random_network(6, 300, "tanh", seed=1)
    x, y = random_data(6, 4, seed=1)
    dp = defended_gradient(net, x, y, "dpsgd:clip=0.01,sigma=2")
    assert dp.defense_noise == pytest.approx(2 * 0.01 / 4)  # σ·clip/B on the average, as Opacus
    assert float(dp.observe(x).norm()) <= 0.01 * (1 + 1e-9)  # a mean of vectors clipped to 0.01
    for name, option in (("secagg", "clients"), ("prune", "ratio"), ("noise", "sigma"), ("dpsgd", "clip")):
        assert getattr(parse_defense(name).options, option) == getattr(make_defense(name).options, option)
    with pytest.raises(GradleakError, match="place=model"):
        parse_defense("dropout:p=0.5")
    with pytest.raises(GradleakError, match="covers"):
        parse_defense("topk")
    with pytest.raises(GradleakError, match="no option 'c'"):
        parse_defense("clip:c=1")


def test_dp_noise_requirement_scales_with_width_and_epsilon():
    small = dp_noise_requirement(random_network(8, 400, "tanh"), 1.0, 1e-5)
    large = dp_noise_requirement(random_network(8, 1600, "tanh"), 1.0, 1e-5)
    # Δ² = Θ(m): quadrupling m doubles the required σ
    assert large.sigma_required / small.sigma_required == pytest.approx(2.0, rel=0.2)
    strict = dp_noise_requirement(random_network(8, 400, "tanh"), 0.5, 1e-5)
    assert strict.sigma_required == pytest.approx(2 * small.sigma_required)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("bound-study")
    return run_study(quick=True, out=out), out


def test_measured_error_is_above_lower_bound_in_every_cell(study):
    result, _ = study
    assert result["draws"] >= 30
    assert result["lower_bound_violations"] == 0
    for cell in result["cells"]:
        if cell["measured"] is not None:
            assert cell["min_measured_over_lower"] >= 1.0, cell
    # every undefended cell lies under the calibrated upper curve by construction; defended cells
    # with a known upper bound must stay within 2× of it (the scaling, not the constant, is tested)
    for cell in result["cells"]:
        if cell["measured"] is not None and cell["upper_calibrated"] is not None:
            assert cell["measured"] <= 2.0 * cell["upper_calibrated"], cell


def test_fitted_slopes_match_theory(study):
    result, _ = study
    s = result["slopes"]
    assert abs(s["measured_vs_m"] + 0.5) <= SLOPE_TOL, s
    assert abs(s["measured_vs_d"] - 0.5) <= SLOPE_TOL, s
    assert abs(s["lower_numeric_vs_m"] + 0.5) <= SLOPE_TOL, s
    assert abs(s["lower_numeric_vs_B"]) <= SLOPE_TOL, s  # the lower bound does not depend on B
    lip = result["lipschitz_checks"]  # bounded-derivative activation (Assumption D.1)
    assert abs(lip["lower_vs_m"] + 0.5) <= SLOPE_TOL, lip
    assert abs(lip["lower_vs_d"] - 0.5) <= SLOPE_TOL, lip


def test_pruning_jump_past_first_layer_share(study):
    result, _ = study
    lip = result["lipschitz_checks"]
    threshold = lip["prune_threshold"]  # d/(d+1)
    ratios = lip["prune_bound_over_unpruned"]
    below = [v for p, v in ratios.items() if p < threshold - 0.02]
    above = [v for p, v in ratios.items() if p > threshold + 0.04]
    assert below and max(below) < 1.05, ratios
    assert above and max(above) > 2.0, ratios
    # the measured attack jumps too: d = 8, threshold 8/9
    prune = {c["defense"]: c["measured"] for c in result["cells"] if c["sweep"] == "prune"}
    assert prune["prune:ratio=0.85,scope=global"] < 1.1 * prune["prune:ratio=0.5,scope=global"]
    assert prune["prune:ratio=0.95,scope=global"] > 1.5 * prune["prune:ratio=0.5,scope=global"]


def test_study_writes_figure_table_and_html(study):
    _, out = study
    for name in ("bound-study.png", "bound-study.json", "bound-study.csv", "bound-study.html"):
        assert (out / name).stat().st_size > 200
    assert "<table>" in (out / "bound-study.html").read_text()


def test_bound_cli(capsys):
    assert main(["bound", "--d", "4", "--m", "50", "--batch-size", "2", "--noise", "0.1",
                 "--defense", "none", "--defense", "prune:ratio=0.9", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["bounds"]) == 2 and report["bounds"][1]["pruned_fraction_hat"] is not None
    assert main(["bound", "--d", "4", "--m", "50", "--noise", "0.1", "--defense", "nope"]) == 2
    assert main(["bound", "--d", "4", "--m", "50", "--noise", "-1"]) == 2
