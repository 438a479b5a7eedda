"""Benchmark suites: LoG pipeline, packing, recompiles, cache, params, and what they share, by name.

One import for the callers that combine them (tools/benchmark.py, device_run.py, the smoke
tests): the suites live in `pipeline` (latency vs the cross-encoder, parameter counts),
`packing` (padding efficiency, recompilations) and `feature_cache` (cached local features); the
sizes, data and models they share in `common`; the timing and the run's record in `protocol`.
The encoder suites (Flax vs PyTorch encoder, train step, kernels) are `logrerank_bench.encoder`.

Every suite returns a flat-ish dict of measured figures (JSON-serialisable). Timings are wall-clock
medians after warm-up, with `block_until_ready` (JAX) so asynchronous dispatch is not mistaken for
speed. The PyTorch peer is transformers' `ModernBertModel` with the same config and the same random
weights (converted with `modernbert_params_from_torch`), fed the same token ids.

Thread counts are set by the caller *before* JAX/torch start (see `tools/benchmark.py`): the
process CPU affinity bounds XLA's CPU thread pool, and `torch.set_num_threads` bounds torch's.
"""

from logrerank_bench.common import (CompileCounter, benchmark_tokenizer, clear_split_cache,
                                    device_peak_memory_gb, encoder_config, encoder_flops,
                                    engine_rerank, init_log_params, load_pools, log_config,
                                    packed_sequences, padded_batches, passage_query, peak_tflops,
                                    pool_query, random_tiny_model, row_len_for, torch_batches,
                                    torch_modernbert)
from logrerank_bench.feature_cache import cache_suite
from logrerank_bench.packing import packing_suite, recompile_suite
from logrerank_bench.pipeline import params_suite, pipeline_suite

__all__ = ["CompileCounter", "benchmark_tokenizer", "cache_suite", "clear_split_cache",
           "device_peak_memory_gb", "encoder_config", "encoder_flops", "engine_rerank",
           "init_log_params", "load_pools", "log_config", "packed_sequences", "packing_suite",
           "padded_batches", "params_suite", "passage_query", "peak_tflops", "pipeline_suite",
           "pool_query", "random_tiny_model", "recompile_suite", "row_len_for", "torch_batches",
           "torch_modernbert"]
