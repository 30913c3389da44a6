"""LAMB: layer-wise adaptive moments for large-batch training.

You et al. 2019, "Large Batch Optimization for Deep Learning: Training BERT in
76 minutes", Algorithm 2. Adam's moments give a per-coordinate direction; LAMB
then rescales each parameter tensor's step by a trust ratio ||w|| / ||update||
so that every layer moves by about the same *relative* amount, whatever the
scale of its gradient. That is what keeps very large batches (and their large
learning rates) stable.

For one parameter tensor w with gradient g at step t (1-based):

    m = b1 m + (1 - b1) g                    v = b2 v + (1 - b2) g^2
    m_hat = m / (1 - b1^t)                   v_hat = v / (1 - b2^t)
    u = m_hat / (sqrt(v_hat) + eps) + wd w   (weight decay decoupled, inside u)
    r = ||w|| / ||u||   (1.0 when either norm is zero)
    w = w - lr r u

Deviation from the paper: the paper clips ||w|| with a function phi; like the
common implementations (TensorFlow Addons, NVIDIA apex) we use phi = identity.
A parameter group may set `trust_ratio=False` to skip the rescaling: the
reference implementation excludes biases and LayerNorm from layer adaptation as
well as from weight decay, and `bertkit.training.optim.build_optimizer` does the same.
"""

import torch

from bertkit.errors import BertkitError, positive


class Lamb(torch.optim.Optimizer):
    """LAMB over the usual torch param groups (lr, betas, eps, weight_decay, trust_ratio)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, trust_ratio=True):
        if lr < 0:
            raise BertkitError(f"LAMB learning rate must be >= 0, got {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise BertkitError(f"LAMB betas must lie in [0, 1), got {betas}")
        positive(eps, "LAMB eps")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, trust_ratio=trust_ratio)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise BertkitError("LAMB does not support sparse gradients; use dense embeddings")
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t = state["step"].item()
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                # u = m_hat / (sqrt(v_hat) + eps), with the bias corrections folded in
                denom = (v / (1 - b2**t)).sqrt_().add_(group["eps"])
                update = (m / (1 - b1**t)).div_(denom)
                if group["weight_decay"] != 0:
                    update.add_(p, alpha=group["weight_decay"])
                ratio = 1.0
                if group["trust_ratio"]:
                    w_norm, u_norm = p.norm(), update.norm()
                    if w_norm > 0 and u_norm > 0:
                        ratio = (w_norm / u_norm).item()
                p.add_(update, alpha=-group["lr"] * ratio)
        return loss
