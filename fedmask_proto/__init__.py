"""Generated gRPC/protobuf stubs of the fedmask wire protocol.

Machine-written by scripts/gen_proto.py from proto/; never edit by hand.
Import the versioned modules, e.g. `from fedmask_proto.v1 import session_pb2`.
"""
