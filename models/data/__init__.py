"""Datasets: fetching, loaders, splits, negative sampling, synthetic generator.

- `models.data.types`     the contracts (Interactions, ImplicitSplit, ExplicitSplit)
- `models.data.fetch`     `fetch_dataset` (hash-pinned ML-100K from the recbole wheel)
- `models.data.loaders`   `load_dataset` (by name, folder or file), `detect_format`, `filter_users`
- `models.data.recbole`, `models.data.grouplens`, `models.data.lastfm`, `models.data.generic_csv`
                          one loader per format
- `models.data.errors`    `DataFormatError`, `DatasetNotFoundError`
- `models.data.tables`    reading text tables with line numbers (shared by the loaders)
- `models.data.assemble`  `Interactions` from parsed columns: the rules every loader shares
- `models.data.features`  side-feature encoding shared by the loaders
- `models.data.synthetic` `synthetic` (planted low-rank data for tests)
- `models.data.splits`    `leave_one_out`, `random_explicit_split`
- `models.data.sampling`  `sample_negatives`, `cohort_data` (torch)

Nothing is re-exported here so that importing a numpy-only module never pulls torch.
"""
