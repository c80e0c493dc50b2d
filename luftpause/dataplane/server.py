"""``luftpause dataplane``: serve the OpenAI-compatible proxy with granian on uvloop."""

from __future__ import annotations

import argparse
import logging
import os

from luftpause import logs
from luftpause.cli import add_config_argument, config_from_args, process_title
from luftpause.config import CONFIG_ENV, split_host_port
from luftpause.ports import hold_listen_lock, refuse_if_in_use


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    # The lock first: two dataplanes started at once would both find the port free, then both bind
    # it (SO_REUSEPORT) and serve under one dataplane id, their leases fighting.
    hold_listen_lock("dataplane", config.dataplane.listen)
    refuse_if_in_use("dataplane", config.dataplane.listen)
    # The granian worker builds the app from the same file (see app.create_app).
    if config.source is not None:
        os.environ[CONFIG_ENV] = os.path.abspath(config.source)
    else:
        os.environ.pop(CONFIG_ENV, None)
    if not os.environ.get("LUFTPAUSE_TOKEN"):
        logging.getLogger("luftpause.dataplane").warning(
            "LUFTPAUSE_TOKEN is not set: every request is accepted without authentication"
        )

    from granian import Granian
    from granian.constants import Interfaces, Loops

    host, port = split_host_port(config.dataplane.listen)
    server = Granian(
        "luftpause.dataplane.app:create_app",
        address=host,
        port=port,
        interface=Interfaces.ASGI,
        loop=Loops.uvloop,
        workers=1,
        factory=True,
        log_access=False,
        process_name=process_title(),
        log_dictconfig=logs.granian_log_config("dataplane"),
    )
    logs.announce(
        "dataplane",
        f"luftpause dataplane: OpenAI-compatible proxy on http://{host}:{port}/v1 "
        f"(scheduler {config.dataplane.scheduler})",
    )
    server.serve()
    return 0
