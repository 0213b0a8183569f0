"""The linear algebra of SPEAR (Dimitrov, Baader, Müller, Vechev, NeurIPS 2024).

A dense layer Z = W X + b (X: n × B, one column per example) followed by ReLU has the weight
gradient G = ∂L/∂Z Xᵀ, of rank ≤ B. Its truncated SVD G = L R (L: m × r, R: r × n) leaves one
unknown r × r matrix Q with ∂L/∂Z = L Q and Xᵀ = Q⁻¹ R. Column i of ∂L/∂Z vanishes at every
unit that example i leaves inactive (about half of them), so q_i spans the kernel of any r − 1
rows of L taken among those units. The search samples such row subsets, keeps the kernel
directions whose L q has many exact zeros (a wrong direction has only the r − 1 it was built
from), picks r of them greedily, resolves each one's scale from the bias gradient
(∂L/∂b = L Q 1) and checks the result against the ReLU pattern it implies.

Guided sampling (ours, not the paper's): a subset succeeds only if every sampled unit is inactive
for the same example, so units inactive for many examples are worth drawing more often. Each
row gives a pseudo-example G_j / (∂L/∂b)_j, a weighted mean of the examples active at unit j;
the fraction of them unit j leaves inactive estimates how often it is inactive, and once
directions are found, their exact zero patterns refine the estimate. Draws cycle between the
uniform weights of the paper and sharper powers of the estimate. Also ours: draws conditioned on
verified examples' zero patterns (`Sampler.draw_conditioned`), the last direction found by a scan
along the missing example's one free direction (`complete_last`), and a linear-program check that
some input's ReLU pattern explains each direction (`relu_pattern_feasible`). docs/spear.md.

Over 400 lines: one algorithm (decomposition, sampler, selection, completion) whose steps
share their state; this docstring is 20 of them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# relative size under which an entry of L q counts as an exact zero; the gradient is float32
# (relative rounding ~1e-7), the smallest entry of a real ∂L/∂Z column rarely below 1e-5 of its largest
ZERO_TOLERANCE = 1e-6
# relative singular value under which the gradient has no further direction (float32 rounding)
RANK_TOLERANCE = 1e-5
# powers of the estimated inactivity that the draws cycle through (0 = the paper's uniform draws)
WEIGHT_POWERS = (0.0, 2.0, 4.0, 8.0)
# relative singular value under which a zero pattern's rows leave a further kernel direction
KERNEL_GAP = 1e-6
# verified candidates beyond r kept for swaps when the first r do not explain the ReLU pattern
SPARE_CANDIDATES = 8
# conditioned draws: on the zero patterns of this many verified examples (2: on adult B = 25, seed
# 0, 24 of 25 directions in 200k draws against 22 without)
CONDITION_ON = 2
SWAP_PASSES = 3  # passes of single swaps
DROP_EVERY = 8  # chunks between tries of dropping each chosen direction and completing the rest
# the greedy choice stops after this many consecutive pooled directions failed the ReLU check (an
# example active at most units can be less sparse than a hundred directions from cancellations)
REJECTION_STREAK = 128
# relative residual under which a direction's nonzero entries lie in the span of the head's weight
# rows (an example's own column: 4e-8 to 5e-8 on adult B = 16 through mlp:hidden=256; a pair's
# cancellation: 0.99 to 1.0)
HEAD_TOLERANCE = 1e-4
HEAD_CHUNK = 1 << 24  # numbers of the masked head copies held at once (128 MiB in float64)


@dataclass
class Decomposition:
    """G = L R on the rows (units) that saw any example; the bias gradient; the layer."""

    left: torch.Tensor  # m_live × r
    right: torch.Tensor  # r × n
    bias_grad: torch.Tensor  # m_live
    weight: torch.Tensor  # m × n, the layer's weights (all units)
    bias: torch.Tensor  # m
    live: torch.Tensor  # bool m: units with a nonzero gradient row
    singular: torch.Tensor  # the leading singular values (r + 1 where there are)
    total: torch.Tensor  # L⁺ ∂L/∂b = Q 1: the columns of Q sum to it

    @property
    def rank(self) -> int:
        return int(self.left.shape[1])


def decompose(g_weight: torch.Tensor, g_bias: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
              batch: int) -> Decomposition:
    g_weight, g_bias = g_weight.double(), g_bias.double()
    norms = g_weight.norm(dim=1)
    live = norms > 1e-12 * float(norms.max().clamp_min(1e-300))
    u, s, vh = torch.linalg.svd(g_weight[live], full_matrices=False)
    rank = min(batch, int((s > RANK_TOLERANCE * s[0]).sum()))
    left = u[:, :rank] * s[:rank]
    total = torch.linalg.lstsq(left, g_bias[live][:, None]).solution[:, 0]
    return Decomposition(left, vh[:rank], g_bias[live], weight.double(), bias.double(), live, s[:rank + 1], total)


def inactivity_estimate(dec: Decomposition, g_weight: torch.Tensor) -> torch.Tensor:
    """Per live unit, the fraction of pseudo-examples G_j / (∂L/∂b)_j it leaves inactive."""
    rows = g_weight.double()[dec.live]
    usable = dec.bias_grad.abs() > 1e-3 * dec.bias_grad.abs().max()
    pseudo = rows[usable] / dec.bias_grad[usable, None]
    pre = pseudo @ dec.weight[dec.live].T + dec.bias[dec.live]
    return (pre <= 0).double().mean(0)


class Pool:
    """Distinct sparse directions (unit rows) with their zero patterns over the live units, and for
    each whether a ReLU pattern explains it (None until checked)."""

    def __init__(self, rank: int, units: int):
        self.directions = torch.zeros(0, rank, dtype=torch.float64)
        self.zeros = torch.zeros(0, units, dtype=torch.bool)
        self.verdicts: list[bool | None] = []

    def __len__(self) -> int:
        return len(self.verdicts)

    def known(self, q: torch.Tensor) -> torch.Tensor:
        """For each row of q, whether it repeats a pooled direction."""
        if not len(self):
            return torch.zeros(len(q), dtype=torch.bool)
        return (q @ self.directions.T).abs().max(1).values > 1 - 1e-8

    def add(self, q: torch.Tensor, zero: torch.Tensor) -> bool:
        if bool(self.known(q[None])[0]):
            return False
        self.directions = torch.cat([self.directions, q[None]])
        self.zeros = torch.cat([self.zeros, zero[None]])
        self.verdicts.append(None)
        return True


def zero_pattern(normed_left: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    y = normed_left @ q
    return y.abs() <= ZERO_TOLERANCE * y.abs().max(-1, keepdim=True).values


def kernel_directions(normed_left: torch.Tensor, zero: torch.Tensor) -> list[torch.Tensor]:
    """The sparse directions that the rows of a zero pattern annihilate. A one-dimensional kernel
    is one example's direction (least squares over all the rows). A two-dimensional one means the
    pattern is shared by two examples (the draw hit units inactive for both): each of them zeroes a
    further set of rows at one exact angle in that plane, the two most frequent angles."""
    _, s, vh = torch.linalg.svd(normed_left[zero], full_matrices=False)
    if len(s) < vh.shape[0] - 1:
        return []
    if len(s) < 2 or s[-2] > KERNEL_GAP * s[0]:
        q = vh[-1]
        return [q / q.norm()]
    if len(s) >= 3 and s[-3] <= KERNEL_GAP * s[0]:
        return []  # three or more examples share the pattern: leave it to other draws
    u, v = vh[-2], vh[-1]
    a, c = normed_left[~zero] @ u, normed_left[~zero] @ v
    angle = torch.remainder(torch.atan2(-a, c), math.pi)
    angle = torch.where(angle > math.pi - 1e-9, angle - math.pi, angle)
    ordered, _ = torch.sort(angle)
    breaks = torch.nonzero(ordered.diff() > 1e-7).flatten() + 1
    groups = torch.tensor_split(ordered, breaks.tolist())
    groups = sorted((g for g in groups if len(g) >= 2), key=len, reverse=True)[:2]
    out = []
    for g in groups:
        t = float(g.median())
        q = math.cos(t) * u + math.sin(t) * v
        out.append(q / q.norm())
    return out


def repeated_value(values: torch.Tensor, tolerance: float = 1e-8) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of `values`, the value repeated most often (to a relative tolerance) and how often."""
    ordered, _ = torch.sort(values, dim=1)
    scale = ordered.abs().max(1, keepdim=True).values.clamp_min(1e-30)
    same = ordered.diff(dim=1).abs() <= tolerance * scale
    run = torch.zeros_like(same, dtype=torch.long)
    current = torch.zeros(len(values), dtype=torch.long)
    for t in range(same.shape[1]):
        current = torch.where(same[:, t], current + 1, 0)
        run[:, t] = current
    best, where = run.max(1) if same.shape[1] else (current, current)
    return ordered[torch.arange(len(values)), where], best + 1


def relu_pattern_feasible(pre_map: torch.Tensor, bias: torch.Tensor, inactive: torch.Tensor) -> bool:
    """Is there an input x = Rᵀa in the gradient's row space whose ReLU pattern W x + b is
    inactive exactly at `inactive` (all m units)? A column of ∂L/∂Z must have the sparsity of
    some example's pattern; a direction whose zeros come from cancellations between examples
    (∂L/∂Y of different examples can be proportional on many units, e.g. with two classes) has
    none. Linear program: the largest margin t ≤ 1 with s_j (M_j a + b_j) ≥ t."""
    from scipy.optimize import linprog

    sign = torch.where(inactive, -1.0, 1.0).double()
    m, r = pre_map.shape
    a_ub = torch.cat([-(sign[:, None] * pre_map), torch.ones(m, 1, dtype=torch.float64)], 1)
    b_ub = sign * bias
    cost = torch.zeros(r + 1, dtype=torch.float64)
    cost[-1] = -1.0
    result = linprog(cost.numpy(), A_ub=a_ub.numpy(), b_ub=b_ub.numpy(),
                     bounds=[(None, None)] * r + [(None, 1.0)], method="highs")
    return bool(result.status == 0 and -result.fun > -1e-9 * max(1.0, float(bias.abs().max())))


class Sampler:
    """Draws row subsets in chunks and pools the kernel directions that pass the sparsity filter."""

    def __init__(self, dec: Decomposition, inactivity: torch.Tensor, min_zeros: int, generator: torch.Generator,
                 head: torch.Tensor | None = None):
        left = dec.left
        self.dec = dec
        self.left_norms = left.norm(dim=1)
        self.normed = left / self.left_norms[:, None]
        self.rank = dec.rank
        self.prior = inactivity
        self.min_zeros = min_zeros
        self.generator = generator
        self.pool = Pool(self.rank, int(left.shape[0]))
        self.pre_map = dec.weight @ dec.right.T  # pre-activations of x = Rᵀa are pre_map a + b
        # the head's weight rows on the live units (m_live × k), when one dense layer alone takes the
        # ReLU output: an example's ∂L/∂Z is Hᵀδ on its active units, so a direction whose nonzeros
        # leave that span mixes examples (with two classes all Hᵀδ are parallel, and the difference of
        # two examples' columns cancels on every unit both activate: as sparse as either, or sparser)
        self.head = head
        self.drawn = 0
        self.chunks = 0
        self.checks = 0  # linear programs solved

    def weights(self) -> torch.Tensor:
        power = WEIGHT_POWERS[self.chunks % len(WEIGHT_POWERS)]
        estimate = self.prior
        accepted = [i for i, v in enumerate(self.pool.verdicts) if v]
        if accepted:
            found = self.pool.zeros[accepted].double().mean(0)
            k, k0 = len(accepted), 4.0  # the prior estimate counts as four examples' worth
            estimate = (found * k + self.prior * k0) / (k + k0)
        return (estimate.clamp_min(1e-3) ** power).clamp_min(1e-12)

    def draw(self, count: int) -> int:
        """Draw `count` subsets; return how many new directions entered the pool. Once enough
        directions are verified, every other chunk is conditioned on some of them."""
        if self.head is not None:
            # the head's span leaves (almost) only examples' own directions in the pool: check them
            # now, so that draws conditioned on them start before r − 1 are found
            for index, verdict in enumerate(self.pool.verdicts):
                if verdict is None:
                    self.verify(index)
        accepted = [i for i, v in enumerate(self.pool.verdicts) if v]
        if len(accepted) >= CONDITION_ON + 2 and self.chunks % 2 == 1:
            chosen = torch.randperm(len(accepted), generator=self.generator)[:CONDITION_ON].tolist()
            return self.draw_conditioned(count, [accepted[i] for i in chosen])
        m, r = self.normed.shape
        logw = self.weights().log()
        uniform = torch.rand(count, m, generator=self.generator, dtype=torch.float64).clamp(1e-300, 1 - 1e-16)
        rows = torch.topk(logw - torch.log(-torch.log(uniform)), r - 1, dim=1).indices  # Gumbel top-k
        sub = self.normed[rows]  # count × (r−1) × r
        extra = torch.randn(count, 1, r, generator=self.generator, dtype=torch.float64)
        rhs = torch.zeros(count, r, 1, dtype=torch.float64)
        rhs[:, -1] = 1.0
        q, info = torch.linalg.solve_ex(torch.cat([sub, extra], 1), rhs)
        q = q[..., 0]
        ok = (info == 0) & torch.isfinite(q).all(1)
        self.drawn += count
        self.chunks += 1
        return self.keep(q[ok])

    def draw_conditioned(self, count: int, found: list[int]) -> int:
        """Draws among the units inactive for `found` verified examples S: r − 1 − |S| of them and
        orthogonality to q_S leave v, the part of a new q_i outside span(q_S), when the rows are
        inactive for i too. q_i = v + Σ c_l q_l, each c_l read as the value −L_j v / L_j q_l that
        repeats exactly over the units inactive for S except l (those of them inactive for i)."""
        m, r = self.normed.shape
        q_s, z_s = self.pool.directions[found], self.pool.zeros[found]
        rows = z_s.all(0).nonzero().flatten()
        k = r - 1 - len(found)
        self.drawn += count
        self.chunks += 1
        if len(rows) < k + 2:
            return 0
        uniform = torch.rand(count, len(rows), generator=self.generator, dtype=torch.float64).clamp(1e-300, 1 - 1e-16)
        picked = rows[torch.topk(self.weights()[rows].log() - torch.log(-torch.log(uniform)), k, dim=1).indices]
        extra = torch.randn(count, 1, r, generator=self.generator, dtype=torch.float64)
        system = torch.cat([self.normed[picked], q_s.expand(count, -1, -1), extra], 1)
        rhs = torch.zeros(count, r, 1, dtype=torch.float64)
        rhs[:, -1] = 1.0
        v, info = torch.linalg.solve_ex(system, rhs)
        v = v[..., 0] / v[..., 0].norm(dim=1, keepdim=True)
        q, ok = v.clone(), (info == 0) & torch.isfinite(v).all(1)
        for index in range(len(found)):
            others = torch.cat([z_s[:index], z_s[index + 1:]])
            units = ((others.all(0) if len(others) else torch.ones(m, dtype=torch.bool)) & ~z_s[index]).nonzero()[:, 0]
            if len(units) < 2:
                return 0
            ratio = -(v @ self.normed[units].T) / (self.normed[units] @ q_s[index])
            value, length = repeated_value(ratio)
            ok &= length >= 2
            q = q + value[:, None] * q_s[index]
        return self.keep(q[ok & torch.isfinite(q).all(1)])

    def keep(self, q: torch.Tensor) -> int:
        """Pool the directions among q (unit rows) that pass the sparsity filter; how many are new."""
        q = q / q.norm(dim=1, keepdim=True)
        y = q @ self.normed.T
        zeros = y.abs() <= ZERO_TOLERANCE * y.abs().max(1, keepdim=True).values
        passing = (zeros.sum(1) >= self.min_zeros) & self.in_head_span(y, zeros)
        q, zeros = q[passing], zeros[passing]
        fresh = ~self.pool.known(q)
        new = 0
        for direction, zero in zip(q[fresh], zeros[fresh]):
            if bool(self.pool.known(direction[None])[0]):
                continue
            for found in kernel_directions(self.normed, zero):
                pattern = zero_pattern(self.normed, found)
                if int(pattern.sum()) >= self.min_zeros and self.spans(found, pattern):
                    new += self.pool.add(found, pattern)
        return new

    def in_head_span(self, y: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
        """Per row of y = q Lᵀ (normalised rows of L), whether its nonzero entries lie in the span
        of the head's weight rows there (all True without a head, or where fewer than twice the
        head's width are nonzero: too few entries to tell)."""
        if self.head is None or not len(y):
            return torch.ones(len(y), dtype=torch.bool)
        m, k = self.head.shape
        rows = max(1, HEAD_CHUNK // (m * k))  # the masked heads below hold rows × m × k numbers
        return torch.cat([self._in_head_span(y[a:a + rows], zeros[a:a + rows]) for a in range(0, len(y), rows)])

    def _in_head_span(self, y: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
        assert self.head is not None
        column = y * self.left_norms  # L q: undo the row normalisation
        support = (~zeros).double()
        weighted = self.head[None] * support[..., None]  # rows × m × k
        normal = weighted.transpose(1, 2) @ self.head  # rows × k × k
        rhs = weighted.transpose(1, 2) @ column[..., None]
        coef, info = torch.linalg.solve_ex(normal, rhs)
        residual = ((column - (self.head @ coef)[..., 0]) * support).norm(dim=1)
        ok = (info == 0) & (residual <= HEAD_TOLERANCE * (column * support).norm(dim=1))
        return ok | (support.sum(1) < 2 * self.head.shape[1])

    def spans(self, q: torch.Tensor, zero: torch.Tensor) -> bool:
        return bool(self.in_head_span((self.normed @ q)[None], zero[None])[0])

    def verify(self, index: int) -> bool:
        """Whether some input's ReLU pattern explains pooled direction `index` (checked once)."""
        verdict = self.pool.verdicts[index]
        if verdict is None and not self.spans(self.pool.directions[index], self.pool.zeros[index]):
            verdict = self.pool.verdicts[index] = False
        if verdict is None:
            inactive = torch.ones(len(self.dec.live), dtype=torch.bool)
            inactive[self.dec.live] = self.pool.zeros[index]
            verdict = relu_pattern_feasible(self.pre_map, self.dec.bias, inactive)
            self.pool.verdicts[index] = verdict
            self.checks += 1
        return verdict


@dataclass
class Solution:
    inputs: torch.Tensor  # r × n
    delta: torch.Tensor  # m_live × r, ∂L/∂Z of each recovered example
    agreement: float  # fraction of (unit, example) pairs whose ReLU state matches ∂L/∂Z's sparsity
    chosen: list[int]


def solve(dec: Decomposition, directions: torch.Tensor) -> Solution | None:
    """Inputs for r unit directions (columns of Q up to scale), or None when they are degenerate."""
    r = dec.rank
    if torch.linalg.matrix_rank(directions) < r:
        return None
    # ∂L/∂b = L Q 1 with Q = Q̄ diag(σ): Q̄ σ = L⁺ ∂L/∂b
    sigma = torch.linalg.solve(directions, dec.total)
    if bool((sigma.abs() < 1e-12 * sigma.abs().max()).any()):
        return None
    q = directions * sigma
    inputs = torch.linalg.solve(q, dec.right)  # Xᵀ = Q⁻¹ R
    delta = dec.left @ q
    return Solution(inputs, delta, relu_agreement(dec, inputs, delta), [])


def settled(values: torch.Tensor) -> torch.Tensor:
    """`values` on a fixed grid: float32's precision at the power of two above their largest
    magnitude, smaller values to zero. MKL's results can differ in their last bits between two runs
    of one seed (with the arrays' memory alignment), and rounded to float32 the near-zero entries
    (pixels that are zero in the data, solved to ~1e-10) then differed; on the grid they agree."""
    top = float(values.abs().max()) if values.numel() else 0.0
    if not math.isfinite(top) or top == 0.0:
        return values
    step = 2.0 ** (math.ceil(math.log2(top)) - 24)
    return torch.round(values / step) * step


def relu_agreement(dec: Decomposition, inputs: torch.Tensor, delta: torch.Tensor) -> float:
    """How well the recovered inputs' ReLU pattern explains the sparsity of ∂L/∂Z (1.0 = fully).
    A unit that no example activates has no gradient row: every example must leave it inactive."""
    pre = inputs @ dec.weight.T + dec.bias  # r × m
    scale = pre.abs().max()
    observed = torch.zeros_like(pre, dtype=torch.bool)
    observed[:, dec.live] = (delta.abs() > ZERO_TOLERANCE * delta.abs().max(0).values).T
    predicted = pre > 0
    # at a pre-activation within rounding of 0 the client's ReLU could have gone either way
    undecided = pre.abs() <= 1e-6 * scale
    return float(((observed == predicted) | undecided).double().mean())


def select(sampler: Sampler) -> Solution | None:
    """The greedy choice: pooled directions by decreasing sparsity, each checked against the ReLU
    patterns, skipping one whose zeros are a strict subset of a chosen one's (a mixture of
    examples) or that is not independent of those chosen, until r are chosen; then the inputs,
    and while their ReLU agreement is below 1, further candidates swapped in one at a time."""
    dec, pool = sampler.dec, sampler.pool
    r = dec.rank
    if len(pool) < r - 1:
        return None
    sizes = pool.zeros.sum(1)
    order = torch.argsort(sizes, descending=True, stable=True).tolist()
    chosen: list[int] = []
    spare: list[int] = []
    streak = 0
    for i in order:
        if len(chosen) == r and len(spare) >= SPARE_CANDIDATES:
            break
        if not sampler.verify(i):
            streak += 1
            if streak >= REJECTION_STREAK:
                break  # into the directions from cancellations, less sparse than the examples' own
            continue
        streak = 0
        zero = pool.zeros[i]
        if any(bool((zero <= pool.zeros[j]).all()) for j in chosen):
            continue
        trial = pool.directions[chosen + [i]]
        if len(chosen) < r and int(torch.linalg.matrix_rank(trial)) == len(chosen) + 1:
            chosen.append(i)
        else:
            spare.append(i)
    if len(chosen) == r - 1:
        last = complete_last(sampler, chosen)
        if last is not None:
            chosen.append(last)
    if len(chosen) < r:
        return None
    best = solve(dec, pool.directions[chosen].T)
    if best is not None and best.agreement >= 1.0:
        best.chosen = chosen
        return best
    for _ in range(SWAP_PASSES):
        improved = False
        for other in spare:
            if best is not None and best.agreement >= 1.0:
                break
            for slot in range(r):
                if other in chosen:
                    break
                trial = chosen[:slot] + [other] + chosen[slot + 1:]
                result = solve(dec, pool.directions[trial].T)
                if result is not None and (best is None or result.agreement > best.agreement):
                    best, chosen, improved = result, trial, True
        if not improved:
            break
    if (best is None or best.agreement < 1.0) and sampler.chunks % DROP_EVERY == 0:
        # a verified direction that is no example's: drop each chosen one in turn, complete the rest
        for slot in range(r):
            rest = chosen[:slot] + chosen[slot + 1:]
            last = complete_last(sampler, rest)
            result = None if last is None else solve(dec, pool.directions[rest + [last]].T)
            if result is not None and result.agreement >= 1.0:
                best, chosen = result, rest + [last]
                break
    if best is not None:
        best.chosen = chosen
    return best


def complete_last(sampler: Sampler, chosen: list[int]) -> int | None:
    """The last direction from r − 1 chosen ones. The missing example's row a of Q⁻¹ is orthogonal
    to every other column of Q, so a = t·e with e known; as t runs over the real line its ReLU
    pattern (t M e + b ≤ 0) changes at one unit at a time, and the interval whose inactive units
    annihilate one direction gives it. Returns its pool index, or None."""
    dec, pool = sampler.dec, sampler.pool
    _, _, vh = torch.linalg.svd(pool.directions[chosen])
    slope, bias = sampler.pre_map @ vh[-1], dec.bias
    breaks = torch.sort((-bias / slope)[slope.abs() > 0]).values
    if not len(breaks):
        return None
    points = torch.cat([breaks[:1] - 1, (breaks[1:] + breaks[:-1]) / 2, breaks[-1:] + 1])
    inactive = points[:, None] * slope + bias <= 0  # intervals × units
    feasible = inactive[:, ~dec.live].all(1) & (inactive[:, dec.live].sum(1) >= sampler.min_zeros)
    for pattern in inactive[feasible][:, dec.live]:
        _, s, vh_z = torch.linalg.svd(sampler.normed[pattern], full_matrices=False)
        if s[-1] > KERNEL_GAP * s[0]:
            continue
        q = vh_z[-1] / vh_z[-1].norm()
        zero = zero_pattern(sampler.normed, q)
        if not torch.equal(zero, pattern):
            continue
        same = (pool.directions @ q).abs() > 1 - 1e-8
        if bool(same.any()):
            index = int(same.nonzero()[0, 0])
        else:
            pool.add(q, zero)
            index = len(pool) - 1
        return index if sampler.verify(index) else None
    return None


def min_zeros(dec: Decomposition, min_sparsity: float) -> int:
    """Zeros a direction needs to pass the filter: the r − 1 it was built from and a fraction of the units."""
    live = int(dec.left.shape[0])
    return dec.rank - 1 + max(2, math.ceil(min_sparsity * live))
