"""Client (device) states, one per protocol stage."""
