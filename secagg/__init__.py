"""Bonawitz et al. (CCS 2017) secure aggregation with the SecAgg+ sparse graphs of Bell et al. (CCS 2020).

A pure library: standard library, numpy and cryptography only; no I/O.
"""
