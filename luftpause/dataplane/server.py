"""``luftpause dataplane``: serve the OpenAI-compatible proxy with granian on uvloop."""

from __future__ import annotations

import argparse
import logging
import os
from functools import partial

from luftpause import logs
from luftpause.cli import add_config_argument, config_from_args, process_title
from luftpause.config import split_host_port
from luftpause.ports import hold_listen_lock, refuse_if_in_use


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    # The lock first: two dataplanes started at once would both find the port free, then both bind
    # it (SO_REUSEPORT) and serve under one dataplane id, their leases fighting.
    hold_listen_lock("dataplane", config.dataplane.listen)
    refuse_if_in_use("dataplane", config.dataplane.listen)
    if not os.environ.get("LUFTPAUSE_TOKEN"):
        logging.getLogger("luftpause.dataplane").warning(
            "LUFTPAUSE_TOKEN is not set: every request is accepted without authentication"
        )

    from granian import Granian
    from granian.constants import Interfaces, Loops

    from luftpause.dataplane.app import create_app

    host, port = split_host_port(config.dataplane.listen)
    server = Granian(
        "luftpause.dataplane.app:create_app",  # a label only: the loader below builds the app
        address=host,
        port=port,
        interface=Interfaces.ASGI,
        loop=Loops.uvloop,
        workers=1,
        log_access=False,
        process_name=process_title(),
        log_dictconfig=logs.granian_log_config("dataplane"),
    )
    logs.announce(
        "dataplane",
        f"luftpause dataplane: OpenAI-compatible proxy on http://{host}:{port}/v1 "
        f"(scheduler {config.dataplane.scheduler})",
    )
    # The worker builds the app from this configuration, the one checked here: file, environment
    # variables and flags alike (the worker sees no flags, and the file may change meanwhile).
    server.serve(target_loader=partial(create_app, config), wrap_loader=False)
    return 0
