"""The server: the ASGI application and its route table (``app``), one turn's life raced against
its client leaving (``turns``), and ``count_tokens``. The top group: it may use intake, link and
relay; the exchange with granian (``luftpause.dataplane.asgi``), the metrics and usage
(``luftpause.dataplane.observe``) and the ``luftpause dataplane`` command
(``luftpause.dataplane.command``) are outside it."""
