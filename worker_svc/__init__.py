"""worker_svc: owns the device, GPTBigCode weights and KV pool tensors; runs extend/decode and sampling."""
