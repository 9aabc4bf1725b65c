"""`python -m tandem.operator`: run the RLHFJob operator (kopf) with this package's handlers.

Caller: the chart's Deployment (and the tests, as a subprocess). Watches every namespace unless
`--namespace` is given (repeatable). Runs standalone (no kopf peering resources). With
`--leader-elect` (the chart's default, two replicas) a replica first waits for the Lease of
`tandem.operator.runtime.leader` and serves its liveness endpoint as a standby meanwhile; a leader that
loses the Lease exits at once with status 1. Settings come from the environment (see
`tandem.operator.runtime.env_settings` and `tandem.operator.runtime.leader`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger("tandem.operator")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tandem.operator", description=__doc__)
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable); default: all namespaces",
    )
    parser.add_argument(
        "--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    parser.add_argument(
        "--peering", default=None, help="kopf peering object name (enables peering; needs its CRD and RBAC)"
    )
    parser.add_argument("--leader-elect", action="store_true",
                        help="run only while holding the operator's Lease (several replicas, one active)")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("-q", "--quiet", action="store_true")
    args = parser.parse_args(argv)

    import kopf

    kopf.configure(verbose=args.verbose, quiet=args.quiet)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

    from tandem.operator.runtime import handlers  # noqa: F401 - registers the handlers
    from tandem.operator.runtime.log_hygiene import quiet_routine_successes

    if not args.verbose:  # every timer pass and pod event would log a success line
        quiet_routine_successes()

    options: dict[str, Any] = dict(standalone=args.peering is None, peering_name=args.peering,
                                   clusterwide=not args.namespace, namespaces=args.namespace,
                                   liveness_endpoint=args.liveness)
    if args.leader_elect:
        return asyncio.run(_elected(options))
    kopf.run(**options)
    return 0


async def _standby_health(endpoint: str | None) -> Any:
    """The liveness endpoint while waiting for the Lease (kopf serves it once leading)."""
    if not endpoint:
        return None
    from aiohttp import web

    async def ok(_: web.Request) -> web.Response:
        return web.json_response({"standby": True})

    url = urlsplit(endpoint)
    app = web.Application()
    app.router.add_get(url.path or "/", ok)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, url.hostname, url.port or 80).start()
    return runner


async def _elected(options: dict[str, Any]) -> int:
    import kopf

    from tandem.operator.cluster.kube import connect
    from tandem.operator.runtime.leader import ElectionConfig, LeaderElector

    api = await connect(4)
    elector = LeaderElector(api, ElectionConfig.from_env())
    health = await _standby_health(options["liveness_endpoint"])
    await elector.acquire()
    if health is not None:
        await health.cleanup()
    operator = asyncio.create_task(kopf.operator(**options))
    holding = asyncio.create_task(elector.hold())
    await asyncio.wait({operator, holding}, return_when=asyncio.FIRST_COMPLETED)
    if holding.done():  # as client-go: stop at once; the next leader owns every write from now on
        log.error(f"leader election: {holding.result()}; exiting")
        logging.shutdown()
        os._exit(1)
    holding.cancel()
    await elector.release()
    await api.close()
    operator.result()  # an operator that crashed exits non-zero
    return 0


if __name__ == "__main__":
    sys.exit(main())
