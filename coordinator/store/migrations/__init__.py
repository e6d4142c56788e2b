"""Alembic migrations of the store (run through coordinator.store.migrate)."""
