"""Run the controller app in the foreground on os-ken's ``AppManager.run_apps``.

os-ken 4.x has no ``osken-manager``; this is the project's replacement, used
by ``emu controller``. It listens on ``settings.listen`` only (loopback unless
told otherwise), never on os-ken's default ``0.0.0.0`` and legacy port 6633.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

from controllers.core import Settings

APP = "controllers.eflops_controller"


def run_foreground(settings: Settings, log_level: str = "INFO") -> None:
    """Block running the app until SIGINT/SIGTERM. ``settings`` must have passed :meth:`Settings.check`."""
    # os-ken is imported here, not at the top: eventlet's monkey patching (hub.patch) must run before
    # os-ken's other modules and the app are imported, and only the foreground controller wants it.
    from os_ken.lib import hub

    hub.patch(thread=False)

    from os_ken import cfg
    from os_ken.base import app_manager
    from os_ken.controller import controller  # noqa: F401 - registers the ofp-* options

    from controllers import eflops_controller

    cfg.CONF(args=[], project="os_ken")
    host, port = settings.listen
    cfg.CONF.set_override("ofp_listen_host", host)
    cfg.CONF.set_override("ofp_tcp_listen_port", port)
    # Otherwise os-ken also listens for TLS on 6653/6633 when only TCP is set; no TLS port is opened
    # unless a key and certificate are configured, which they are not.
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("os_ken").setLevel(logging.WARNING)
    eflops_controller.configure(settings)

    def _stop(signum, frame):
        # run_apps cannot unwind cleanly (os-ken 4.2 calls kill() on its threads, which they lack),
        # and there is nothing to save: the switches keep their entries (fail-mode secure).
        logging.getLogger("eflops.controller").info("stopped by signal %d", signum)
        logging.shutdown()
        os._exit(0)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    app_manager.AppManager.run_apps([APP])
