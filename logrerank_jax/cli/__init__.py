"""The `logrerank` console command (train, rerank, evaluate, serve, convert).

  main          `logrerank COMMAND ARGS`: the command list and the dispatch
  train         one training stage (absl flags; the config is checked before JAX loads)
  rerank        JSONL in, reranked JSONL out (and explanation pages)
  evaluate      rerankers side by side on pools with qrels
  serve         the HTTP server
  convert       PyTorch checkpoints <-> model folders
  atomic_files  outputs written under a temporary name and renamed into place
  sharding      multi-host reranking: one shard per process, merged by process 0

tools/train.py, rerank.py, evaluate.py, serve.py and convert_torch.py run these commands.
"""
