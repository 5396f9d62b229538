"""sparkgate: stage confidence-scheduled speculative decoding across a serving fleet.

The five layers (``verify_runtime``, ``policies``, ``collectors``, ``controller``,
``dashboards``) live in their own folders at the top of the repository; each is
linked here (``sparkgate/<layer>`` is a symlink to ``<layer>/``), so they install
and import as ``sparkgate.<layer>``. This package itself holds only what sits
above every layer: the command table (``cli``) and the demo, which starts
processes and never runs a model.
"""
