"""sparkgate: stage confidence-scheduled speculative decoding across a serving fleet.

The five layers (``verify_runtime``, ``policies``, ``collectors``, ``controller``,
``dashboards``) live in their own folders at the top of the repository and are
installed as subpackages of this one (``pyproject.toml``'s ``package-dir``). This
package itself holds only what sits above every layer: the command table
(``cli``) and the demo, which starts processes and never runs a model.
"""
