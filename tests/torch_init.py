"""Random weights for the tiny transformers models of the parity and conversion tests.

Two recipes, each used by several test files (their tolerances were derived with them, so each
is kept exactly; `torch_reference.randomise_` is the second with std 0.2). A parameter is a norm's if "norm" is in its lowercased name (ModernBERT's
`*norm.*`, BERT's `LayerNorm.*`).
"""

import torch


def _is_norm(name: str) -> bool:
  return "norm" in name.lower()


def randomise_normal(model, seed: int):
  """One Gaussian draw per tensor: norm weights 1 + 0.2 n, norm params and biases 0.1 n, the rest
  0.15 n. Weight std 0.15 keeps pre-activations and attention logits O(1), as in trained models
  (the parity tests' tolerance notes rely on it)."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      if _is_norm(name) and name.endswith("weight"):
        p.copy_(1.0 + 0.2 * noise)
      elif _is_norm(name) or name.endswith("bias"):
        p.copy_(0.1 * noise)
      else:
        p.copy_(0.15 * noise)
  return model.eval()


def randomise_uniform_norms(model, seed: int, std: float = 0.15):
  """Norm weights uniform in [0.5, 1.5), biases 0.1 n, the rest `std` n: every tensor clearly
  nonzero and distinct (the conversion tests check that each lands in its own place)."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if _is_norm(name) and name.endswith("weight"):
        p.copy_(0.5 + torch.rand(p.shape, generator=g))
      elif name.endswith("bias"):
        p.copy_(0.1 * torch.randn(p.shape, generator=g))
      else:
        p.copy_(std * torch.randn(p.shape, generator=g))
  return model.eval()
