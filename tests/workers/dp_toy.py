"""Train a toy masked regression data-parallel; save final params. Run in a subprocess.

Usage: python dp_toy.py MODE NUM_DEVICES OUT.npz [MODE NUM_DEVICES OUT.npz ...]
  MODE: pmap | shard_map | jit, or "double": checked shard_map with the step as it was before
  the gradient fix (no varying cast of the params), which reduces the gradient twice.
Several runs go one after another in this one process (they share the start-up), each on the
first NUM_DEVICES devices, with its own data and state; a "double" run restores the real step
when it ends. XLA_FLAGS must already force the CPU device count (it is read at JAX start-up) to at
least the largest NUM_DEVICES.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

from logrerank_jax.training import step as step_lib
from pre_fix_step import gradient_reduced_twice  # tests/workers/, this script's folder

LR = 0.05


def loss_fn(params, batch, rng):
  # Masked squared error plus a dropout-free L1 term with a different weight (valid count).
  pred = batch["x"] @ params["w"] + params["b"]                     # [n]
  err = jnp.where(batch["mask"], (pred - batch["y"]) ** 2, 0.0)
  l1 = jnp.where(batch["mask2"], jnp.abs(pred), 0.0)
  return {"mse": (err.sum(), batch["mask"].sum()), "l1": (l1.sum(), batch["mask2"].sum())}


def run_one(mode, ndev, out):
  devices = jax.local_devices()[:ndev]
  assert len(devices) == ndev, (len(jax.local_devices()), ndev)
  rs = np.random.RandomState(0)
  params = {"w": jnp.asarray(rs.randn(5).astype(np.float32)), "b": jnp.zeros((), jnp.float32)}
  # Plain SGD: the update is exactly -LR * gradient, so a gradient scaled by the device count
  # (reduced twice) moves the params that much further. Adam (scale-free for eps << |g|) and
  # tight norm clipping (which rescales every large gradient to the same norm) would both hide it.
  tx = optax.sgd(LR)
  state = step_lib.create_train_state(params, tx, seed=13)
  coefs = {"mse": 1.0, "l1": 0.1}
  if mode == "pmap":
    run = step_lib.pmap_step(step_lib.make_per_device_step(loss_fn, coefs, tx))
    state = step_lib.replicate(state, devices)
  elif mode in ("shard_map", "double"):
    run, mesh = step_lib.shard_map_step(step_lib.make_per_device_step(loss_fn, coefs, tx), devices)
    state = step_lib.put_replicated(state, mesh)
  elif mode == "jit":
    run, mesh = step_lib.jit_step(step_lib.make_global_step(loss_fn, coefs, tx), devices)
    state = step_lib.put_replicated(state, mesh)
  else:
    raise SystemExit(f"unknown mode {mode!r}")
  losses = []
  for i in range(12):
    # Unequal valid counts per device slice, so a naive per-device mean would differ.
    batch = {"x": rs.randn(8, 5).astype(np.float32), "y": rs.randn(8).astype(np.float32),
             "mask": rs.rand(8) < 0.7, "mask2": rs.rand(8) < 0.4}
    if mode == "pmap":
      state, metrics = run(state, step_lib.shard_for_pmap(batch, ndev))
      metrics = step_lib.unreplicate(metrics)
    elif mode == "jit":  # the global step takes the device shares stacked: [ndev, 8 / ndev, ...]
      state, metrics = run(state, step_lib.put_sharded(step_lib.shard_for_pmap(batch, ndev), mesh))
    else:
      state, metrics = run(state, step_lib.put_sharded(batch, mesh))
    losses.append(float(metrics["loss"]))
  final = step_lib.unreplicate(state) if mode == "pmap" else state
  np.savez(out, w=np.asarray(final.params["w"]), b=np.asarray(final.params["b"]),
           step=np.asarray(final.step), losses=np.asarray(losses))


def main():
  args = sys.argv[1:]
  if not args or len(args) % 3:
    raise SystemExit("usage: dp_toy.py MODE NUM_DEVICES OUT.npz [MODE NUM_DEVICES OUT.npz ...]")
  for i in range(0, len(args), 3):
    mode, ndev, out = args[i], int(args[i + 1]), args[i + 2]
    with gradient_reduced_twice(active=mode == "double"):
      run_one(mode, ndev, out)


if __name__ == "__main__":
  main()
