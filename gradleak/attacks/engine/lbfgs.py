"""L-BFGS whose direction comes from the memory's Gram matrix instead of the two-loop recursion.

torch.optim.LBFGS computes each direction by the two-loop recursion (Nocedal & Wright,
Numerical Optimization, algorithm 7.4): at a memory of 100 pairs, 400 calls on vectors of the
size of the candidate. Gradient inversion's candidates are small (four MNIST images are 3,136
floats), so those calls are dispatch, not arithmetic: 1.45 ms of each 4.6 ms CPL evaluation
(docs/sweeps-and-report.md). The recursion is two triangular solves in disguise (Byrd, Nocedal
& Schnabel, Math. Programming 1994): with S and Y the stored steps and gradient changes and
T = triu(S Yᵀ), the first loop's coefficients solve T a = S q and the second loop's
corrections solve Tᵀ c = diag(T) a − Y r₀. Keeping T up to date costs one matrix-vector
product per stored pair, and a direction four matrix-vector products and two solves of the
memory's size. The iteration, the step length, the optional strong-Wolfe line search and
every stopping test are torch's; only the arithmetic order of the direction differs, so
results agree with torch's to the last digits of float32."""
from __future__ import annotations

import torch
from torch.optim.lbfgs import _strong_wolfe


class _Memory:
    """The last `size` pairs (s, y) in ring slots, with s_p·y_q for every pair of slots."""

    def __init__(self, size: int, like: torch.Tensor) -> None:
        self.size = size
        self.steps = like.new_zeros(size, like.numel())  # S: one stored step per slot
        self.changes = like.new_zeros(size, like.numel())  # Y: one gradient change per slot
        self.products = like.new_zeros(size, size, dtype=torch.float64)  # [p, q] = s_p · y_q (p no newer)
        self.start = 0
        self.count = 0

    def push(self, step: torch.Tensor, change: torch.Tensor) -> None:
        if self.count == self.size:  # the oldest pair's slot takes the new one
            slot = self.start
            self.start = (self.start + 1) % self.size
        else:
            slot = (self.start + self.count) % self.size
            self.count += 1
        self.steps[slot] = step
        self.changes[slot] = change
        # only s_p·y_q with p no newer than q enters the direction (T is upper triangular), and
        # the newest pair is the newest: its column is all that changes
        self.products[:, slot] = (self.steps @ change).double()

    def direction(self, gradient: torch.Tensor, scale) -> torch.Tensor:
        """−H·gradient for the L-BFGS inverse Hessian H of the stored pairs with initial
        Hessian `scale`·I (the two-loop recursion's result)."""
        order = (torch.arange(self.count, device=gradient.device) + self.start) % self.size  # oldest first
        gram = self.products[order][:, order]
        upper = gram.triu()

        def gather(vector: torch.Tensor) -> torch.Tensor:
            return vector.double()[order]

        def scatter(values: torch.Tensor) -> torch.Tensor:
            out = gradient.new_zeros(self.size)
            out[order] = values.to(gradient.dtype)
            return out

        q = gradient.neg()
        coefficients = torch.linalg.solve_triangular(upper, gather(self.steps @ q)[:, None], upper=True)[:, 0]
        q = q - self.changes.T @ scatter(coefficients)
        r = q * scale
        rhs = gram.diagonal() * coefficients - gather(self.changes @ r)
        corrections = torch.linalg.solve_triangular(upper.T, rhs[:, None], upper=False)[:, 0]
        return r + self.steps.T @ scatter(corrections)


class GramLBFGS(torch.optim.LBFGS):
    """torch.optim.LBFGS with the direction of `_Memory` (module docstring); same arguments."""

    @torch.no_grad()
    def step(self, closure):  # type: ignore[override]
        if len(self.param_groups) != 1:
            raise ValueError("GramLBFGS takes one parameter group")
        closure = torch.enable_grad()(closure)
        group = self.param_groups[0]
        lr = float(group["lr"])
        max_iter, max_eval = group["max_iter"], group["max_eval"]
        tolerance_grad, tolerance_change = group["tolerance_grad"], group["tolerance_change"]
        line_search_fn = group["line_search_fn"]

        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)
        orig_loss = closure()
        loss = float(orig_loss)
        current_evals = 1
        state["func_evals"] += 1
        flat_grad = self._gather_flat_grad()
        if flat_grad.abs().max() <= tolerance_grad:
            return orig_loss

        d, t = state.get("d"), state.get("t")
        memory: _Memory | None = state.get("memory")
        scale = state.get("H_diag")
        prev_flat_grad, prev_loss = state.get("prev_flat_grad"), state.get("prev_loss")
        opt_cond = False
        n_iter = 0
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1
            if state["n_iter"] == 1 or memory is None:
                d = flat_grad.neg()
                memory = _Memory(group["history_size"], flat_grad)
                scale = 1
            else:
                y = flat_grad.sub(prev_flat_grad)
                s = d.mul(t)
                ys = y.dot(s)
                if ys > 1e-10:
                    memory.push(s, y)
                    scale = ys / y.dot(y)
                d = memory.direction(flat_grad, scale) if memory.count else flat_grad.neg().mul(scale)
            if prev_flat_grad is None:
                prev_flat_grad = flat_grad.clone(memory_format=torch.contiguous_format)
            else:
                prev_flat_grad.copy_(flat_grad)
            prev_loss = loss

            t = min(1.0, 1.0 / float(flat_grad.abs().sum())) * lr if state["n_iter"] == 1 else lr
            gtd = flat_grad.dot(d)
            if gtd > -tolerance_change:
                break
            ls_func_evals = 0
            if line_search_fn is not None:
                if line_search_fn != "strong_wolfe":
                    raise ValueError("only 'strong_wolfe' is supported")
                x_init = self._clone_param()

                def obj_func(x, step_length, direction):
                    return self._directional_evaluate(closure, x, step_length, direction)

                loss, flat_grad, t, ls_func_evals = _strong_wolfe(obj_func, x_init, t, d, loss, flat_grad, gtd,
                                                                  max_ls=max_eval - current_evals)
                self._add_grad(t, d)
                opt_cond = bool(flat_grad.abs().max() <= tolerance_grad)
            else:
                self._add_grad(t, d)
                if n_iter != max_iter:
                    # torch's: no evaluation after the last iteration (the next step makes its own)
                    with torch.enable_grad():
                        loss = float(closure())
                    flat_grad = self._gather_flat_grad()
                    opt_cond = bool(flat_grad.abs().max() <= tolerance_grad)
                    ls_func_evals = 1
            current_evals += ls_func_evals
            state["func_evals"] += ls_func_evals

            if n_iter == max_iter or current_evals >= max_eval or opt_cond:
                break
            if d.mul(t).abs().max() <= tolerance_change or abs(loss - prev_loss) < tolerance_change:
                break

        state.update(d=d, t=t, memory=memory, H_diag=scale, prev_flat_grad=prev_flat_grad, prev_loss=prev_loss)
        return orig_loss
