"""Where a controller listens unless told otherwise: one definition for the service and its clients.

A module of its own so that a client (the dashboards) learns the address without
importing the service and its web stack.
"""

DEFAULT_PORT = 8470
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"
