"""Alembic revision files (Alembic itself skips this __init__.py)."""
