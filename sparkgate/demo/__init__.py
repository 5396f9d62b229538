"""``sparkgate demo``: a local fleet walks the rollout, takes a fault and falls back by itself.

This subpackage only starts processes (``sparkgate serve`` and ``sparkgate replica``
children), injects the fault and summarises what the controller stored; it never
imports the runtime or runs a model (docs/design.md §1).
"""
