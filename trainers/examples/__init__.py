"""Runnable training examples: gloo on CPU, nccl on GPU, each resuming exactly."""
