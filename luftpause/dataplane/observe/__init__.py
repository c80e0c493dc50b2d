"""What the dataplane records of its turns, below the four groups so that each may record: the
Prometheus metrics ``/metrics`` serves (``metrics``), the per-answer histograms and counters by
model, replica, class and caller root (``answer_metrics``), and the token usage per caller that
``GET /admin/usage`` and ``/status`` show (``usage``)."""
