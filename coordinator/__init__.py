"""The gRPC coordinator (issue 4)."""
