"""Recommendation models, data, evaluation and the batched federation engine (no gRPC, no databases)."""
