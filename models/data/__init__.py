"""Datasets: fetching, loaders, splits, negative sampling, synthetic generator."""
