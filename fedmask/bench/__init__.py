"""`fedmask bench ...`: federation benchmarks over real processes on
127.0.0.1 (coordinator + edge clients), and the process launcher shared
with `fedmask demo` (see federation.py and processes.py)."""
