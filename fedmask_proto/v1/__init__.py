"""Stubs of protobuf package `fedmask.v1` (proto/fedmask/v1/*.proto).

Machine-written by scripts/gen_proto.py; never edit by hand.
"""
