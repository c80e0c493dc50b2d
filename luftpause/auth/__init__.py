"""Who may reach luftpause's listeners, and as whom (docs/architecture.md "Auth").

* :mod:`.tokens`: the shared ``LUFTPAUSE_TOKEN`` and the ``Authorization: Bearer`` check
  (constant-time), common to every process;
* :mod:`.callers`: optional caller keys, API keys each mapped to a caller and the service classes
  it may use, which the dataplane's ``/v1`` routes take instead of the shared token;
* :mod:`.hosts`: the ``Host`` allow-list of the scheduler's HTTP routes (DNS rebinding);
* :mod:`.grpc_link`: the token on the dataplane-to-scheduler gRPC link (a server interceptor that
  refuses a call without it, ``UNAUTHENTICATED``, and the client's channel and metadata);
* :mod:`.tls`: opt-in TLS and mutual TLS from the configuration's PEM files, for granian, aiohttp
  and gRPC.

Every refusal a process answers over HTTP has the JSON error body ``{"error": {"message"}}``.
"""
