"""The real model: paged KV cache and one flat forward pass over mixed prefill/decode spans."""
