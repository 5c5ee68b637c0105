"""Models: loading a folder for training or inference (LoRA, 4-bit), sampling with the action contract (constrained
decoding, shared prefill), and the vLLM engine."""
