"""Generated protobuf and gRPC code: edit proto/, then run scripts/gen_proto.py."""
