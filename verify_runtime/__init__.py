"""The verification runtime: target model, KV cache, ragged packing, graph tiers,
lossless acceptance, the four verify modes and the continuous-batching engine.

It emits one step record per verify step (``collectors.schema``) and never writes
to a store or decides phases itself.
"""
