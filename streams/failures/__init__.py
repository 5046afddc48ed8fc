"""Online failure mining: per-episode failure detection, failed-episode embeddings, incremental
clustering of failures, and the faust agents that run them."""
