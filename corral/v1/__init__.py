"""Generated gRPC stubs of the corral.v1 contract (protos/generate.py); do not edit."""
