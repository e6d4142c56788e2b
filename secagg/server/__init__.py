"""Server states, one per protocol stage, mirroring secagg.client."""
