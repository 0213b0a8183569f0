"""GramLBFGS: the two-loop recursion's direction from the memory's Gram matrix."""
import torch

from gradleak.attacks.engine.lbfgs import GramLBFGS, _Memory


def _two_loop(steps, changes, gradient, scale):
    """torch.optim.LBFGS's recursion, written out as Nocedal & Wright's algorithm 7.4."""
    q = gradient.neg()
    rho = [1 / y.dot(s) for s, y in zip(steps, changes)]
    alphas = [None] * len(steps)
    for i in reversed(range(len(steps))):
        alphas[i] = steps[i].dot(q) * rho[i]
        q = q - alphas[i] * changes[i]
    r = q * scale
    for i in range(len(steps)):
        beta = changes[i].dot(r) * rho[i]
        r = r + (alphas[i] - beta) * steps[i]
    return r


def test_direction_is_the_two_loop_recursions_before_and_after_the_memory_wraps():
    generator = torch.Generator().manual_seed(0)
    n, size = 500, 7
    memory = _Memory(size, torch.zeros(n))
    steps, changes = [], []
    for pushed in range(1, 20):
        s = torch.randn(n, generator=generator)
        y = s * (0.5 + torch.rand(n, generator=generator)) + 0.1 * torch.randn(n, generator=generator)
        memory.push(s, y)
        steps, changes = (steps + [s])[-size:], (changes + [y])[-size:]
        gradient, scale = torch.randn(n, generator=generator), y.dot(s) / y.dot(y)
        expected = _two_loop(steps, changes, gradient, scale)
        got = memory.direction(gradient, scale)
        # float32 in a different order: agreement to ~1e-7 relative here (seeds 0-4); 1e-5 allows
        # for the conditioning, while a wrong sign, pair order or slot is off by O(1)
        assert float((got - expected).norm() / expected.norm()) < 1e-5, pushed


def test_optimizes_as_torchs_lbfgs_on_a_smooth_problem():
    generator = torch.Generator().manual_seed(1)
    a = torch.randn(60, 60, generator=generator)
    a = a @ a.T / 60 + 0.1 * torch.eye(60)
    b = torch.randn(60, generator=generator)

    def minimise(cls, line_search):
        x = torch.zeros(60, requires_grad=True)
        optimizer = cls([x], lr=1, max_iter=4, history_size=5, line_search_fn=line_search)

        def closure():
            optimizer.zero_grad()
            loss = 0.5 * x @ a @ x - b @ x + 0.01 * x.pow(4).sum()
            loss.backward()
            return loss.detach()

        for _ in range(3):
            optimizer.step(closure)
        return x.detach()

    for line_search in (None, "strong_wolfe"):
        ours, torchs = minimise(GramLBFGS, line_search), minimise(torch.optim.LBFGS, line_search)
        # 12 iterations from the same start, not converged yet (the first differs from the last
        # by O(1)): the iterates agree to float32 rounding
        assert float((ours - torchs).norm() / torchs.norm()) < 1e-4, line_search
