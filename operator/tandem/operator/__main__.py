"""`python -m tandem.operator`: run the RLHFJob operator (kopf) with this package's handlers.

Caller: the chart's Deployment (and the tests, as a subprocess). Watches every namespace unless
`--namespace` is given (repeatable). Runs standalone (no kopf peering resources) by default: run
one replica. Settings come from the environment (see `tandem.operator.config`).
"""

from __future__ import annotations

import argparse
import logging
import sys


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
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("-q", "--quiet", action="store_true")
    args = parser.parse_args(argv)

    import kopf

    kopf.configure(verbose=args.verbose, quiet=args.quiet)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

    from tandem.operator import handlers  # noqa: F401 - registers the handlers
    from tandem.operator.log_hygiene import quiet_routine_successes

    if not args.verbose:  # every timer pass and pod event would log a success line
        quiet_routine_successes()

    kopf.run(
        standalone=args.peering is None,
        peering_name=args.peering,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
