"""The local stack: FreeInference Batch on one machine (moto, API Gateway emulation, pollers,
simulated upstream). A development tool, not part of the Lambda layer."""
