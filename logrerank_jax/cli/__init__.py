"""The `logrerank` console command (train, rerank, evaluate, serve, convert)."""
