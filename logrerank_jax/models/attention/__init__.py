"""Attention kernels, a leaf of the model package: nothing here imports an encoder.

  reference       the plain softmax attention every kernel is checked against
  dispatch        `attention_impl` names -> kernels, resolved once per backend
  block_schedule  which key blocks each query block needs (segments, sliding windows)
  tiled           the CPU/any-backend tiled kernel with its own backward
  blocked         window layers over neighbouring key blocks in plain XLA ops (`"blocked"`)
  pallas_gpu      block-skipping flash attention in Pallas Triton
  splash_tpu      JAX's splash attention on TPU
"""
