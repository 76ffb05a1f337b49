"""Deterministic random weights for exported test models, and the error measure, shared by the GPU scripts.

The libraries' own initialisations make poor test models: torchvision's MobileNetV2 shrinks its activations
to 1e-9 by the logits (below fp16's smallest subnormal, so an fp16 build returns zeros and matches nothing),
and Hugging Face heads start at zero (the output is then the bias alone). These weights keep every layer's
output in a range both precisions represent, so a comparison tests every layer.
"""
import math


def reinit(model, torch):
    """Deterministic random weights that make every layer matter (non-trivial norms and biases)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            for name, p in list(m.named_parameters(recurse=False)) + list(m.named_buffers(recurse=False)):
                if p is None or not p.dtype.is_floating_point:
                    continue
                if isinstance(m, (torch.nn.BatchNorm2d, torch.nn.LayerNorm)) or "norm" in type(m).__name__.lower():
                    if name in ("weight", "running_var"):
                        p.copy_(torch.rand(p.shape, generator=g) + 0.5)
                    else:
                        p.copy_((torch.rand(p.shape, generator=g) - 0.5) * 0.2)
                elif name.endswith("bias"):
                    p.copy_((torch.rand(p.shape, generator=g) - 0.5) * 0.2)
                elif p.dim() >= 2:
                    fan_in = p[0].numel() if not isinstance(m, torch.nn.Embedding) else 50
                    p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)


def rel_err(got, want):
    """Relative error max|got - want| / max|want| and why it is infinite (shape, NaN or inf), shared by the GPU
    scripts so every table means the same thing by it."""
    import numpy as np
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf"), f"shape {got.shape} != {want.shape}"
    if np.isnan(got).any() or np.isnan(want).any():
        return float("inf"), "NaN"
    if not np.isfinite(got).all() or not np.isfinite(want).all():
        return float("inf"), "inf"
    scale = max(np.abs(want).max(), np.finfo(np.float64).tiny)
    return float(np.abs(got - want).max() / scale), ""
