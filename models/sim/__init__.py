"""The simulator behind `fedmask simulate` and `fedmask study`: a whole
federation in one process (engine, the platform-level runner, the memory
plan, the private tables, FedMMF's hybrid rounds, progress, results and
study aggregation). Production code (coordinator, edge_client) never
imports it: it takes models from `models.registry` and `models.platforms`
(pyproject.toml's import-linter contracts)."""
