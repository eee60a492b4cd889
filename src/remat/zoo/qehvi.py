"""qEHVI: the q-Expected Hypervolume Improvement of Daulton et al. (2020), seeds/000 Table 3.

The case is one step of acquisition optimization: the value of qEHVI at ``b`` batches of
``q`` candidates ``X`` (shape ``(b, q, d)``, the differentiated input), estimated with ``mc``
quasi-MC samples of a multi-output GP posterior, over the box decomposition of the
non-dominated region of ``m`` objectives. Its big intermediates (``mc x b x cells x
C(q, i) x m`` for each subset size ``i``) come from cheap pointwise ops on small tensors:
the case where a min cut saves far less than autograd (5.3 GB -> 0.95 GB in Table 3).

What botorch does and what plain torch does. botorch builds everything that does not
depend on ``X``: a ``SingleTaskGP`` (one independent RBF-kernel GP per objective,
standardized outcomes) on random training data, a ``FastNondominatedPartitioning`` of
the training objectives (the hypercell bounds), and the Sobol normal base samples. The
forward, which torch.compile sees, is plain torch with the same math as botorch's
``qExpectedHypervolumeImprovement``: the exact GP posterior mean and covariance at ``X``
(from the cached Cholesky factor of the training kernel), posterior samples
``mean + chol(cov) @ z``, and the inclusion-exclusion over subsets of the ``q`` candidates.
Why not botorch's own forward: its posterior goes through gpytorch/linear_operator,
which breaks the graph ~15 times (``Tensor.item()`` in ``CatLinearOperator``), takes
minutes to compile with inductor, and with remat's min cut the backward failed with "a
variable needed for gradient computation has been modified by an inplace operation" (a
value saved at one graph break is mutated in place by the eager code between graphs;
PyTorch's partitioner did not save that value). The plain forward is one graph. The
tests check that its posterior equals ``gp.posterior(X)`` and its value equals botorch's
``qExpectedHypervolumeImprovement._compute_qehvi`` on the same samples.

The GP is not fitted (random data; fixed hyperparameters: lengthscale 0.5, noise 1e-3,
zero mean). Training objectives lie near a front (random directions in the positive
orthant, radius in [0.9, 1]) so that many points are Pareto-optimal and the box
decomposition has many cells. Botorch works in float64; the tensors are then cast to the
case's dtype.

=====  ====  ===  =====  ==  ===  ===  ==========================================
size   d     m    n      q   b    mc   notes
=====  ====  ===  =====  ==  ===  ===  ==========================================
tiny   3     2    12     3   2    8    10 cells
small  6     2    64     5   16   128  26 cells
full   6     2    256    8   64   128  44 cells; mc x b x cells x C(q,i) x m summed over i is 184M
                                      elements (0.7 GB in float32) per kind of intermediate
=====  ====  ===  =====  ==  ===  ===  ==========================================

``b`` is the batch dimension (``batch=`` overrides it). The loss is ``-qehvi(X).sum()``.
"""

from __future__ import annotations

import itertools
import math
import warnings

import torch
from torch import nn

from .registry import register

# d, m, n, q, b, mc
_SIZES = {"tiny": (3, 2, 12, 3, 2, 8), "small": (6, 2, 64, 5, 16, 128), "full": (6, 2, 256, 8, 64, 128)}
LENGTHSCALE, NOISE = 0.5, 1e-3


def _rbf(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """exp(-|a_i - b_j|^2 / 2) over the last dimension (inputs already divided by the lengthscale)."""
    d = a.unsqueeze(-2) - b.unsqueeze(-3)
    return torch.exp(-0.5 * d.pow(2).sum(-1))


class QEHVI(nn.Module):
    """``forward(X: (b, q, d)) -> (b,)``: the MC estimate of qEHVI at each batch of candidates."""

    def __init__(self, gp, partitioning, base_samples: torch.Tensor, q: int):
        super().__init__()
        tx = gp.train_inputs[0]
        tx = tx[0] if tx.dim() == 3 else tx  # (n, d); batched models repeat it per output
        ls = gp.covar_module.lengthscale.detach().reshape(-1, tx.shape[-1])  # (m, d)
        m = gp.num_outputs
        ls = ls.expand(m, -1)
        noise = gp.likelihood.noise.detach().reshape(-1).expand(m)
        const = gp.mean_module.constant.detach().reshape(-1).expand(m)
        y = gp.train_targets.reshape(m, -1)  # standardized targets (m, n)
        ot = gp.outcome_transform
        y_mean, y_std = ot.means.detach().reshape(-1), ot.stdvs.detach().reshape(-1)
        ts = tx.unsqueeze(0) / ls.unsqueeze(1)  # (m, n, d)
        k = _rbf(ts, ts) + noise.view(m, 1, 1) * torch.eye(tx.shape[0], dtype=tx.dtype)
        chol = torch.linalg.cholesky(k)
        eye = torch.eye(tx.shape[0], dtype=tx.dtype).expand_as(chol)
        self.register_buffer("train_scaled", ts)
        self.register_buffer("lengthscale", ls.clone())
        self.register_buffer("chol_inv", torch.linalg.solve_triangular(chol, eye, upper=False))
        self.register_buffer("alpha", torch.cholesky_solve((y - const.view(m, 1)).unsqueeze(-1), chol).squeeze(-1))
        self.register_buffer("const", const.clone())
        self.register_buffer("y_mean", y_mean.clone())
        self.register_buffer("y_std", y_std.clone())
        lower, upper = partitioning.get_hypercell_bounds()
        self.register_buffer("cell_lower", lower.clone())  # (cells, m)
        self.register_buffer("cell_upper", upper.clone())
        self.register_buffer("base_samples", base_samples.clone())  # (mc, m, q)
        self.q, self.m = q, m
        for i in range(1, q + 1):
            idx = torch.tensor(list(itertools.combinations(range(q), i)), dtype=torch.long)
            self.register_buffer(f"subsets_{i}", idx, persistent=False)  # (C(q, i), i)

    def posterior(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean ``(b, m, q)`` and covariance ``(b, m, q, q)`` of the GP posterior at ``X``,
        in the objectives' original scale (botorch's ``gp.posterior(X)``)."""
        xs = X.unsqueeze(-3) / self.lengthscale.unsqueeze(-2)  # (b, m, q, d)
        k_xt = _rbf(xs, self.train_scaled)  # (b, m, q, n)
        mean = self.const.view(-1, 1) + (k_xt @ self.alpha.unsqueeze(-1)).squeeze(-1)
        v = self.chol_inv @ k_xt.transpose(-1, -2)  # (b, m, n, q)
        cov = _rbf(xs, xs) - v.transpose(-1, -2) @ v
        std = self.y_std.view(-1, 1)
        return mean * std + self.y_mean.view(-1, 1), cov * (std * std).unsqueeze(-1)

    def samples(self, X: torch.Tensor) -> torch.Tensor:
        """Posterior samples ``(mc, b, q, m)`` from the fixed base samples."""
        mean, cov = self.posterior(X)
        jitter = 1e-6 if X.dtype == torch.float64 else 1e-4
        eye = torch.eye(self.q, dtype=X.dtype, device=X.device)
        # cholesky_ex: torch.linalg.cholesky checks errors with an effectful op (a with_effects
        # node in the joint graph, which remat cannot plan); a failed factor gives NaNs instead
        root = torch.linalg.cholesky_ex(cov + jitter * eye).L  # (b, m, q, q)
        z = self.base_samples.unsqueeze(1).unsqueeze(-1)  # (mc, 1, m, q, 1)
        s = mean.unsqueeze(0) + (root.unsqueeze(0) @ z).squeeze(-1)  # (mc, b, m, q)
        return s.transpose(-1, -2)

    def hypervolume_improvement(self, obj: torch.Tensor) -> torch.Tensor:
        """botorch's ``_compute_qehvi`` on samples ``obj`` ``(mc, b, q, m)``: ``(b,)``."""
        cells, m = self.cell_lower.shape
        lower = self.cell_lower.view(cells, 1, m)
        upper = self.cell_upper.view(cells, 1, m)
        total = None
        for i in range(1, self.q + 1):
            idx = getattr(self, f"subsets_{i}")  # (C, i)
            sub = obj.index_select(-2, idx.reshape(-1)).view(*obj.shape[:-2], *idx.shape, m)
            corner = sub.min(dim=-2).values  # (mc, b, C, m): the overlap of each subset
            corner = torch.minimum(corner.unsqueeze(-3), upper)  # (mc, b, cells, C, m)
            area = (corner - lower).clamp_min(0.0).prod(dim=-1).sum(dim=-1)  # (mc, b, cells)
            term = area if i % 2 else -area
            total = term if total is None else total + term
        return total.sum(dim=-1).mean(dim=0)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return self.hypervolume_improvement(self.samples(X))


def _neg_sum(out):
    return -out.sum()


def make_botorch(d: int, m: int, n: int, dtype=torch.float64):
    """The botorch objects the case is built from: ``(gp, partitioning, ref_point)`` on random
    data (uses the global RNG)."""
    from botorch.models import SingleTaskGP
    from botorch.models.transforms.outcome import Standardize
    from botorch.utils.multi_objective.box_decompositions.non_dominated import FastNondominatedPartitioning
    from gpytorch.kernels import RBFKernel

    train_x = torch.rand(n, d, dtype=dtype)
    direction = torch.randn(n, m, dtype=dtype).abs()
    direction = direction / direction.norm(dim=-1, keepdim=True)
    train_y = direction * (0.9 + 0.1 * torch.rand(n, 1, dtype=dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # the kernel and outcome transform given explicitly (botorch's defaults changed over
        # versions); QEHVI.posterior implements exactly these
        gp = SingleTaskGP(train_x, train_y, covar_module=RBFKernel(ard_num_dims=d, batch_shape=torch.Size([m])),
                          outcome_transform=Standardize(m=m))
        gp.covar_module.lengthscale = torch.full_like(gp.covar_module.lengthscale, LENGTHSCALE)
        gp.likelihood.noise = torch.full_like(gp.likelihood.noise, NOISE)
        gp.mean_module.constant = torch.zeros_like(gp.mean_module.constant)
    gp.eval()
    ref_point = train_y.min(dim=0).values - 0.1
    partitioning = FastNondominatedPartitioning(ref_point=ref_point, Y=train_y)
    return gp, partitioning, ref_point


@register("qehvi", "pattern",
          "seeds/000 Table 3: qEHVI (Daulton et al. 2020) of q candidates under a 2-objective GP")
def _qehvi(size, batch):
    from botorch.utils.sampling import draw_sobol_normal_samples

    d, m, n, q, b, mc = _SIZES[size]
    b = batch or b
    gp, partitioning, _ = make_botorch(d, m, n)
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    z = draw_sobol_normal_samples(d=q * m, n=mc, dtype=torch.float64, seed=seed).view(mc, m, q)
    model = QEHVI(gp, partitioning, z, q)
    X = torch.rand(b, q, d, dtype=torch.float64).requires_grad_()
    cells = model.cell_lower.shape[0]
    info = dict(d=d, m=m, n=n, q=q, mc=mc, cells=cells,
                largest_intermediate_numel=mc * b * cells * math.comb(q, q // 2) * m)
    return dict(model=model, inputs=(X,), loss=_neg_sum, blocks=[""], batch=b, info=info)
