"""The control plane's HTTP side: the REST bridge, health endpoints and metrics.

Modules: ``rules`` (routes read from the ``google.api.http`` annotations), ``protojson`` (JSON <->
messages, errors naming the field), ``status`` (failed calls as ``google.rpc.Status`` JSON and HTTP
statuses), ``invoke`` (in-process or loopback-gRPC calls into the services), ``connections`` (deadlines
on what clients send, a cap on connections), ``server`` (the aiohttp :class:`Gateway`).
"""

from control.gateway.connections import HttpLimits
from control.gateway.invoke import InProcess, Invoker, Loopback
from control.gateway.rules import PathTemplate, Route, Router, http_routes
from control.gateway.server import Gateway
from control.gateway.status import RpcFailure

__all__ = [
    # server
    "Gateway",
    "HttpLimits",
    # calls into the services; routes; failed calls
    "InProcess",
    "Invoker",
    "Loopback",
    "PathTemplate",
    "Route",
    "Router",
    "RpcFailure",
    "http_routes",
]
