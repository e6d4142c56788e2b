"""The edge client hosting one or many devices (issue 4)."""
