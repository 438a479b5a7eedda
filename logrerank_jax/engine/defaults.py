"""The engine's tunable defaults, in a module that imports nothing.

The command-line flags show these defaults in `--help`; reading them here (not from the module
that uses them) keeps `logrerank rerank --help` and `logrerank serve --help` free of JAX. The
engine modules import their defaults from here, so each value has this one home.
"""

# Records handed to one `score_group`: calls are filled across all of them, so only the last
# call of a chunk is partial. Fixed (not a multiple of the device count) so that the calls, and
# so the scores, are the same on any number of devices.
DEFAULT_CHUNK_RECORDS = 32
# Host threads preparing the next chunks while the devices run (`EngineCore.score`). One keeps the
# device fed when host work per chunk is below device work (true with the compiled splitter);
# on a CPU-only machine it shares the cores with XLA, so more would only contend.
DEFAULT_HOST_WORKERS = 1

# Real tokens (all windows of all passages) per batch: two full calls of the largest default row
# bucket (128 rows of 1,024 tokens), ~28 of the demo's fifty-paragraph pools, about the batch
# CLI's 32-record chunks. With 65,536 the batches of 16 concurrent demo requests held ~3
# requests and the server reached 0.87x the CLI's throughput (one round, machine loaded).
DEFAULT_MAX_BATCH_TOKENS = 262144
# Requests waiting for the engine beyond the batch being prepared and the one being scored.
DEFAULT_MAX_QUEUE = 64
# How long the gather thread waits for more requests after the first of an idle period.
DEFAULT_WINDOW_S = 0.005
