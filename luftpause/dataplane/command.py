"""``luftpause dataplane``: serve the OpenAI-compatible proxy with granian on uvloop.

Each of granian's workers (``[dataplane] workers``, 1 by default) builds the app from the
configuration checked here, with its own link to the scheduler under its own dataplane id
(:func:`luftpause.dataplane.wiring.worker_dataplane_id`): the proxy behind the
listener guard (:mod:`luftpause.serving.listeners`: body deadline, requests at once, stop). The caller
keys and the TLS files are read here first, so that a bad one stops the command (exit 2, one line
naming the file and the key) before any worker starts.
"""

from __future__ import annotations

import argparse
import logging
import sys
from functools import partial

from luftpause.auth.callers import Access
from luftpause.auth.tls import check_listener, check_peer
from luftpause.config import ConfigError, split_host_port
from luftpause.config.arguments import add_config_argument, config_from_args
from luftpause.observe import logs
from luftpause.serving.listeners import granian_options, guarded
from luftpause.serving.ports import hold_listen_lock, refuse_if_in_use
from luftpause.supervise.titles import process_title


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    try:
        access = Access.from_config(config)
        check_listener(config.dataplane.tls, "dataplane.tls")
        check_peer(config.dataplane.scheduler_tls, "dataplane.scheduler_tls")
    except ConfigError as exc:
        print(f"luftpause dataplane: {exc}", file=sys.stderr)
        return 2
    # The lock first: two dataplanes started at once would both find the port free, then both bind
    # it (SO_REUSEPORT) and serve under one dataplane id, their leases fighting.
    hold_listen_lock("dataplane", config.dataplane.listen)
    refuse_if_in_use("dataplane", config.dataplane.listen)
    if access.mode == "open":
        logging.getLogger("luftpause.dataplane").warning(
            "LUFTPAUSE_TOKEN is not set: every request is accepted without authentication"
        )
    elif access.keys is not None:
        logging.getLogger("luftpause.dataplane").info(
            "caller keys: %d configured; the /v1 routes take only them", len(access.keys)
        )

    from granian import Granian
    from granian.constants import Interfaces, Loops

    from luftpause.dataplane.wiring import create_app

    host, port = split_host_port(config.dataplane.listen)
    server = Granian(
        "luftpause.dataplane.wiring:create_app",  # a label only: the loader below builds the app
        address=host,
        port=port,
        interface=Interfaces.ASGI,
        loop=Loops.uvloop,
        workers=config.dataplane.workers,
        log_access=False,
        process_name=process_title(),
        log_dictconfig=logs.granian_log_config("dataplane"),
        **granian_options(config.dataplane.limits, config.dataplane.tls),
    )
    scheme = "https" if config.dataplane.tls is not None else "http"
    logs.announce(
        "dataplane",
        f"luftpause dataplane: OpenAI-compatible proxy on {scheme}://{host}:{port}/v1 "
        f"(scheduler {config.dataplane.scheduler}"
        + (f", {config.dataplane.workers} workers)" if config.dataplane.workers > 1 else ")"),
    )
    # The worker builds the app from this configuration, the one checked here: file, environment
    # variables and flags alike (the worker sees no flags, and the file may change meanwhile),
    # behind the listener guard of [dataplane.limits].
    loader = partial(guarded, partial(create_app, config), config.dataplane.limits, "dataplane")
    server.serve(target_loader=loader, wrap_loader=False)
    return 0
