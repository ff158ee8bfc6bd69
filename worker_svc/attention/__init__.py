"""Attention backends over the paged KV pool: ``torch`` (reference) and ``flashinfer`` (GPU)."""
