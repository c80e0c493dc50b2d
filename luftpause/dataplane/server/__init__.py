"""The server: the ASGI application and its route table (``app``), one HTTP exchange as granian
serves it (``asgi``), the ``luftpause dataplane`` command (``command``), the metrics and usage
served at ``/metrics`` and ``/status``, and ``count_tokens``."""
