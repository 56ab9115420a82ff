"""``serve --cluster URL``: the node's store follows the cluster's event log on NATS JetStream.

The log (one JetStream stream, ``--log-replicas`` copies) is the source of truth and the data
directory's LMDB store the node's materialization of it (``eventstore/log_replica.py``): a commit
is acknowledged once the log holds it, fenced by the node's lease of its shard.

A node takes the lease of every shard before it serves. A node started while another holds them
stands by (one log line says which node) and takes them over when their leases run out: at most
``--lease-ttl`` seconds after that node stopped (killed, paused, cut off), at once when it stopped
cleanly (SIGTERM gives the leases back). It brings its store up to the log first (a new data
directory is rebuilt from it), then serves with an epoch above every earlier owner's. A node that
loses a lease while serving (it was paused past it, or could not renew it) is fenced: the log
refuses its commits, it logs why and stops, exit status 1.

Every node owns every shard while it serves: this is one active node and any number of standbys
on one log. Several active nodes, each owning a share of the shards, are not built yet.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import signal
import socket
import threading
import urllib.parse
from collections.abc import Callable
from typing import Any

import click
import msgspec

from sessionloop.eventstore import LogReplica
from sessionloop.eventstore.jetstream_log import without_userinfo

__all__ = ["ClusterOptions", "cluster_options", "join", "lost_line", "url_secret"]

log = logging.getLogger("sessionloop.cluster")

#: the shortest lease that outlasts a JetStream leader election at R>1 (nats-server's raft waits
#: 4-9 s for a lost leader before it campaigns; the lease's local deadline is 0.8 of its TTL)
MIN_REPLICATED_TTL_S = 15.0


class ClusterOptions(msgspec.Struct, frozen=True):
    """``serve --cluster``'s settings: the NATS servers, this node's id, the leases' TTL, the log's copies."""

    urls: list[str]
    node: str
    lease_ttl_s: float = 10.0
    replicas: int = 1


def _default_node() -> str:
    host = "".join(c for c in socket.gethostname() if c.isalnum() or c in "-_")[:40] or "node"
    return f"{host}-{secrets.token_hex(4)}"


def cluster_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The ``--cluster`` options of ``serve``, handed to it as one ``cluster`` keyword."""

    @click.option("--cluster", "cluster_url", default=None, metavar="URL[,URL...]",
                  help="Join a cluster: the store follows the event log on the NATS JetStream server(s) at URL "
                       "(nats://[TOKEN@]HOST:PORT); the node serves once it holds every shard's lease, and stands "
                       "by while another node holds them.")
    @click.option("--node-id", default=None, metavar="ID",
                  help="With --cluster: this node's name in the cluster (default: the host name and a random "
                       "suffix; at most 64 printable characters).")
    @click.option("--lease-ttl", default=10.0, show_default=True, type=click.FloatRange(0.5, 3600),
                  help="With --cluster: seconds a shard lease holds without renewal (a standby takes over this "
                       "long after the active node stopped); the same on every node of a cluster. With "
                       "--log-replicas 3, 15 or more (a lease must outlast a JetStream leader election).")
    @click.option("--log-replicas", default=1, show_default=True, type=click.Choice(["1", "3"]),
                  help="With --cluster: copies of the log and the leases (3 on a three-server NATS cluster).")
    @functools.wraps(f)
    def wrapper(*args: Any, cluster_url: str | None, node_id: str | None, lease_ttl: float, log_replicas: str,
                **kwargs: Any) -> Any:
        options = None
        if cluster_url is not None:
            urls = [u.strip() for u in cluster_url.split(",") if u.strip()]
            if not urls:
                raise click.BadParameter("needs at least one nats:// URL", param_hint="--cluster")
            node = node_id or _default_node()
            if not node.isprintable() or " " in node or not 0 < len(node.encode()) <= 64:
                raise click.BadParameter(f"{node!r} is not 1 to 64 printable characters without spaces",
                                         param_hint="--node-id")
            options = ClusterOptions(urls, node, lease_ttl, int(log_replicas))
        elif node_id is not None:
            raise click.BadParameter("is only for a cluster node (--cluster URL)", param_hint="--node-id")
        return f(*args, cluster=options, **kwargs)

    return wrapper


def join(options: ClusterOptions, shards: int) -> LogReplica:
    """The node's link to the cluster's log, not opened yet: the store takes every shard's lease
    through it when it opens, standing by while another node holds them (``EventStore.stand_by``)."""
    log.info("node %s joining the cluster at %s (lease ttl %.1f s, log replicas %d)", options.node,
             ", ".join(without_userinfo(u) for u in options.urls), options.lease_ttl_s, options.replicas)
    if options.replicas > 1 and options.lease_ttl_s < MIN_REPLICATED_TTL_S:
        log.warning("--lease-ttl %.1f with --log-replicas %d: a lease must outlast a JetStream leader election "
                    "(4-9 s in nats-server) or losing one NATS server stops this node; %.0f s or more is safe",
                    options.lease_ttl_s, options.replicas, MIN_REPLICATED_TTL_S)
    return LogReplica(options.urls, node=options.node, shards=shards, replicas=options.replicas,
                      lease_ttl_s=options.lease_ttl_s, on_lost=_stop_serving)


def lost_line(replica: LogReplica | None) -> str | None:
    """Why a node stopped serving, if it lost a shard (None otherwise)."""
    if replica is None or not replica.lost:
        return None
    shard, why = next(iter(sorted(replica.lost.items())))
    more = f" and {len(replica.lost) - 1} more" if len(replica.lost) > 1 else ""
    return (f"node {replica.node} lost shard {shard}{more} ({why}) and stopped: the cluster's log refuses its "
            "commits from then on; what it acknowledged is in the log")


_stopping = threading.Event()


def _stop_serving(shard: int, why: str) -> None:
    """A lost lease stops the node as SIGTERM does, once (``serve`` then exits with :func:`lost_line`)."""
    if _stopping.is_set():
        return
    _stopping.set()
    log.critical("stopping: this node no longer owns shard %d (%s)", shard, why)
    os.kill(os.getpid(), signal.SIGTERM)


def url_secret(url: str) -> str | None:
    """The token or password in a ``nats://TOKEN@host`` / ``nats://user:password@host`` URL (no log may show it)."""
    parts = urllib.parse.urlsplit(url if "://" in url else f"nats://{url}")
    return parts.password or parts.username or None
