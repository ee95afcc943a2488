"""The Open Inference Protocol (KServe v2) over gRPC as Triton speaks it: wire messages and service."""
